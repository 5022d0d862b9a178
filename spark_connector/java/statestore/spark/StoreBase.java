package statestore.spark;

import java.util.Set;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;

import scala.jdk.javaapi.CollectionConverters;

/**
 * What read and write stores share: one version of one partition, one column family
 * ({@code default}), one value per key; everything else is refused.
 */
abstract class StoreBase implements ReadStateStore {
  static final String DEFAULT_CF = "default";

  final RingStateStoreProvider provider;
  final long version;
  final StateData data;

  StoreBase(RingStateStoreProvider provider, long version, StateData data) {
    this.provider = provider;
    this.version = version;
    this.data = data;
  }

  static void defaultFamily(String colFamilyName) {
    if (colFamilyName != null && !DEFAULT_CF.equals(colFamilyName)) {
      throw new UnsupportedOperationException(
          "RingStateStoreProvider has one column family ('default'), not '" + colFamilyName + "'");
    }
  }

  @Override
  public StateStoreId id() {
    return provider.stateStoreId();
  }

  @Override
  public long version() {
    return version;
  }

  @Override
  public UnsafeRow get(UnsafeRow key, String colFamilyName) {
    defaultFamily(colFamilyName);
    return data.getRemembered(key); // a write store's put of the key recalls it
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey, String cf) {
    defaultFamily(cf);
    return data.prefixScan(prefixKey);
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> iterator(String cf) {
    defaultFamily(cf);
    return data.iterator();
  }

  @Override
  public scala.collection.Iterator<UnsafeRow> valuesIterator(UnsafeRow key, String cf) {
    throw new UnsupportedOperationException("RingStateStoreProvider: multiple values per key");
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> prefixScanWithMultiValues(UnsafeRow k, String cf) {
    throw new UnsupportedOperationException("RingStateStoreProvider: multiple values per key");
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> iteratorWithMultiValues(String cf) {
    throw new UnsupportedOperationException("RingStateStoreProvider: multiple values per key");
  }

  @Override
  public scala.collection.immutable.Set<String> allColumnFamilyNames() {
    return CollectionConverters.asScala(Set.of(DEFAULT_CF)).toSet();
  }
}
