package statestore.spark;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.BiConsumer;
import java.util.function.BiPredicate;
import java.util.function.LongSupplier;
import java.util.function.ToLongBiFunction;

/**
 * A map of at most {@code limit} bytes, each entry costing what {@code cost} says, the least
 * recently used dropped first, its bytes counted in the executor's {@link StateBudget}. The
 * entry just put is kept whatever it costs, as its caller is about to use it: the map exceeds
 * its limit by at most that one entry, until the next put. The limit is read at each put
 * (the cache's size may change with the executor's config). {@code dropped} is told of each
 * entry the limit pushes out, under the map's lock: it must not take a lock a thread may hold
 * while it calls the map. Thread-safe.
 */
final class ByteLru<K, V> {
  private final LinkedHashMap<K, V> map;
  private final LongSupplier limit;
  private final ToLongBiFunction<? super K, ? super V> cost;
  private final BiConsumer<? super K, ? super V> dropped;
  private long held;

  ByteLru(int capacity, LongSupplier limit, ToLongBiFunction<? super K, ? super V> cost,
      BiConsumer<? super K, ? super V> dropped) {
    this.map = new LinkedHashMap<>(capacity, 0.75f, true);
    this.limit = limit;
    this.cost = cost;
    this.dropped = dropped;
  }

  ByteLru(int capacity, LongSupplier limit, ToLongBiFunction<? super K, ? super V> cost) {
    this(capacity, limit, cost, (k, v) -> { });
  }

  /** The value under {@code key}, which becomes the most recently used; null if none. */
  synchronized V get(K key) {
    return map.get(key);
  }

  /** Whether {@code key} is held (its place in the order unchanged). */
  synchronized boolean contains(K key) {
    return map.containsKey(key);
  }

  /**
   * Hold {@code value} under {@code key} (replacing what was), then drop the least recently
   * used entries, never this one, until the bytes held are within the limit.
   */
  synchronized void put(K key, V value) {
    putIf(key, value, () -> true);
  }

  /**
   * {@link #put}, if {@code ok} says so under the map's lock (an entry whose owner is gone is
   * not held: what decides it is read after the owner's entries were dropped, or before they
   * are, never between); whether it was put.
   */
  synchronized boolean putIf(K key, V value, java.util.function.BooleanSupplier ok) {
    if (!ok.getAsBoolean()) {
      return false;
    }
    V old = map.put(key, value);
    long delta = cost.applyAsLong(key, value) - (old == null ? 0 : cost.applyAsLong(key, old));
    long most = limit.getAsLong();
    var it = map.entrySet().iterator();
    while (held + delta > most && it.hasNext()) {
      Map.Entry<K, V> e = it.next();
      if (e.getKey().equals(key)) {
        break; // the newest: kept, whatever it costs
      }
      delta -= cost.applyAsLong(e.getKey(), e.getValue());
      it.remove();
      dropped.accept(e.getKey(), e.getValue());
    }
    held += delta;
    StateBudget.add(delta);
    return true;
  }

  /** Drop every entry {@code which} accepts (each told to {@code dropped}); how many. */
  synchronized int removeIf(BiPredicate<? super K, ? super V> which) {
    long delta = 0;
    int n = 0;
    var it = map.entrySet().iterator();
    while (it.hasNext()) {
      Map.Entry<K, V> e = it.next();
      if (which.test(e.getKey(), e.getValue())) {
        delta -= cost.applyAsLong(e.getKey(), e.getValue());
        it.remove();
        dropped.accept(e.getKey(), e.getValue());
        n++;
      }
    }
    held += delta;
    StateBudget.add(delta);
    return n;
  }

  /** The bytes held now, by the entries' costs. */
  synchronized long held() {
    return held;
  }

  synchronized int size() {
    return map.size();
  }

  /**
   * Whether the map agrees with itself and with {@code each} (tests): its bytes are its
   * entries' costs summed, and every entry passes {@code each}.
   */
  synchronized boolean consistent(BiPredicate<? super K, ? super V> each) {
    long sum = 0;
    for (Map.Entry<K, V> e : map.entrySet()) {
      if (!each.test(e.getKey(), e.getValue())) {
        return false;
      }
      sum += cost.applyAsLong(e.getKey(), e.getValue());
    }
    return sum == held;
  }
}
