package statestore.spark;

import java.util.Iterator;
import java.util.NoSuchElementException;

/**
 * An iterator that finds each element when asked whether there is one: {@link #advance}
 * gives the next element, or null at the end (so null is never an element). The merges of a
 * version under its overlay and the prefix scans are written with it.
 */
abstract class Lookahead<T> implements Iterator<T> {
  private T next;
  private boolean looked;

  /** The next element, or null when there is none. */
  protected abstract T advance();

  @Override
  public final boolean hasNext() {
    if (!looked) {
      next = advance();
      looked = true;
    }
    return next != null;
  }

  @Override
  public final T next() {
    if (!hasNext()) {
      throw new NoSuchElementException();
    }
    looked = false;
    return next;
  }
}
