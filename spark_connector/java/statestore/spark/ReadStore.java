package statestore.spark;

/** A read-only view of one version. */
final class ReadStore extends StoreBase {
  ReadStore(RingStateStoreProvider provider, long version, StateData data) {
    super(provider, version, data);
  }

  @Override
  public void abort() {}

  @Override
  public void release() {}

  @Override
  public String toString() {
    return "RingReadStateStore[" + provider.storePath() + ", version=" + version + "]";
  }
}
