package statestore.spark;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataType;

import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * One version of the partition in memory, with a prefix index when Spark needs scans.
 *
 * <p>A published version is not changed while another store holds it: write stores keep
 * their changes in an overlay ({@link WriteStore}) and the provider applies them at commit,
 * in place only when the committing store is the version's sole holder (or shares it only
 * with stores of the same task attempt), else to a copy. So every read store, and every
 * other attempt, sees a fixed version.
 */
final class StateData {
  /** The overlay's mark for a removed key (compared by identity). */
  static final UnsafeRow TOMBSTONE = new UnsafeRow(0);

  final ConcurrentHashMap<UnsafeRow, UnsafeRow> map = new ConcurrentHashMap<>();
  private final DataType[] prefixTypes;
  /** Ring stores the version is spread over (key hash shards, {@link StateCommit}). */
  volatile int shards = 1;
  /** Task attempts holding this version through an open store (provider lock). */
  private final ArrayList<Long> holders = new ArrayList<>();
  final ConcurrentHashMap<UnsafeRow, Set<UnsafeRow>> prefixIndex;
  final UnsafeProjection prefixProjection;
  volatile long version;
  volatile long epoch;
  /**
   * The epoch of this version on each shard's ring store, as restored or committed (the
   * {@code base_epoch} the next version's commit names, core/manifest.py "Lineage");
   * {@code null} when not known from the ring (an empty version, a replayed one, one read
   * under the legacy name).
   */
  volatile long[] shardEpochs;
  final AtomicLong bytes = new AtomicLong();
  // how this map was loaded, reported by the first write store that uses it
  long pendingRestoreMs;
  long pendingRestoredRows;
  boolean pendingMiss;
  /** Restored from the store's legacy name: its first commit must be a snapshot. */
  boolean legacy;

  StateData(DataType[] prefixTypes) {
    this.prefixTypes = prefixTypes;
    if (prefixTypes != null) {
      prefixIndex = new ConcurrentHashMap<>();
      prefixProjection = UnsafeProjection.create(prefixTypes);
    } else {
      prefixIndex = null;
      prefixProjection = null;
    }
  }

  /** An independent copy (rows are immutable and shared). */
  StateData copy() {
    StateData out = new StateData(prefixTypes);
    for (Map.Entry<UnsafeRow, UnsafeRow> e : map.entrySet()) {
      out.put(e.getKey(), e.getValue());
    }
    out.version = version;
    out.epoch = epoch;
    out.shards = shards;
    out.shardEpochs = shardEpochs;
    return out;
  }

  /** Apply an overlay (value {@link #TOMBSTONE} = remove). */
  void apply(Map<UnsafeRow, UnsafeRow> overlay) {
    for (Map.Entry<UnsafeRow, UnsafeRow> e : overlay.entrySet()) {
      if (e.getValue() == TOMBSTONE) {
        remove(e.getKey());
      } else {
        put(e.getKey(), e.getValue());
      }
    }
  }

  /** Empty the map (a restore attempt starting again). */
  void clear() {
    map.clear();
    if (prefixIndex != null) {
      prefixIndex.clear();
    }
    bytes.set(0);
  }

  void hold(long task) {
    holders.add(task);
  }

  void release(long task) {
    holders.remove(Long.valueOf(task));
  }

  /** Whether only stores of {@code task} hold this version. */
  boolean onlyHeldBy(long task) {
    for (long t : holders) {
      if (t != task) {
        return false;
      }
    }
    return true;
  }

  UnsafeRow prefixOf(UnsafeRow key) {
    synchronized (prefixProjection) {
      return prefixProjection.apply(key).copy();
    }
  }

  UnsafeRow put(UnsafeRow key, UnsafeRow value) {
    UnsafeRow prev = map.put(key, value);
    if (prev == null) {
      bytes.addAndGet(key.getSizeInBytes() + value.getSizeInBytes() + 64L);
      if (prefixIndex != null) {
        prefixIndex.computeIfAbsent(prefixOf(key), p -> ConcurrentHashMap.newKeySet()).add(key);
      }
    } else {
      bytes.addAndGet(value.getSizeInBytes() - prev.getSizeInBytes());
    }
    return prev;
  }

  UnsafeRow remove(UnsafeRow key) {
    UnsafeRow prev = map.remove(key);
    if (prev != null) {
      bytes.addAndGet(-(key.getSizeInBytes() + prev.getSizeInBytes() + 64L));
      if (prefixIndex != null) {
        UnsafeRow prefix = prefixOf(key);
        Set<UnsafeRow> keys = prefixIndex.get(prefix);
        if (keys != null) {
          keys.remove(key);
          if (keys.isEmpty()) {
            prefixIndex.remove(prefix, keys);
          }
        }
      }
    }
    return prev;
  }

  StateStoreIterator<UnsafeRowPair> iterator() {
    Iterator<Map.Entry<UnsafeRow, UnsafeRow>> it = map.entrySet().iterator();
    return wrap(new Iterator<UnsafeRowPair>() {
      @Override
      public boolean hasNext() {
        return it.hasNext();
      }

      @Override
      public UnsafeRowPair next() {
        Map.Entry<UnsafeRow, UnsafeRow> e = it.next();
        return new UnsafeRowPair(e.getKey(), e.getValue());
      }
    });
  }

  StateStoreIterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey) {
    if (prefixIndex == null) {
      throw new UnsupportedOperationException(
          "prefix scan on a state store created without a prefix key encoding");
    }
    Set<UnsafeRow> keys = prefixIndex.get(prefixKey);
    if (keys == null) {
      return wrap(Collections.emptyIterator());
    }
    Iterator<UnsafeRow> it = new ArrayList<>(keys).iterator();
    return wrap(new Iterator<UnsafeRowPair>() {
      private UnsafeRowPair next = advance();

      private UnsafeRowPair advance() {
        while (it.hasNext()) {
          UnsafeRow k = it.next();
          UnsafeRow v = map.get(k);
          if (v != null) {
            return new UnsafeRowPair(k, v);
          }
        }
        return null;
      }

      @Override
      public boolean hasNext() {
        return next != null;
      }

      @Override
      public UnsafeRowPair next() {
        if (next == null) {
          throw new NoSuchElementException();
        }
        UnsafeRowPair out = next;
        next = advance();
        return out;
      }
    });
  }

  static StateStoreIterator<UnsafeRowPair> wrap(Iterator<UnsafeRowPair> it) {
    return new StateStoreIterator<>(CollectionConverters.asScala(it), () -> BoxedUnit.UNIT);
  }
}
