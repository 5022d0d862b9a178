package statestore.spark;

/** A read-only view of one version, fixed for the store's life. */
final class ReadStore extends StoreBase {
  final long task;
  private boolean released;

  ReadStore(RingStateStoreProvider provider, long version, StateData data, long task) {
    super(provider, version, data);
    this.task = task;
  }

  @Override
  public void abort() {
    release();
  }

  @Override
  public synchronized void release() {
    if (!released) {
      released = true;
      provider.released(this);
    }
  }

  @Override
  public String toString() {
    return "RingReadStateStore[" + provider.storePath() + ", version=" + version + "]";
  }
}
