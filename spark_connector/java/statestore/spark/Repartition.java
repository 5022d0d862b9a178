package statestore.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.Murmur3HashFunction$;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.datasources.v2.state.metadata.StateMetadataPartitionReader;
import org.apache.spark.sql.execution.streaming.checkpointing.CommitMetadata;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetMap;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeq;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqBase;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadataBase;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadataV2;
import org.apache.spark.sql.execution.streaming.operators.stateful.StatePartitionKeyExtractorFactory$;
import org.apache.spark.sql.execution.streaming.runtime.StreamingQueryCheckpointMetadata;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.OfflineStateRepartitionErrors$;
import org.apache.spark.sql.execution.streaming.state.OfflineStateRepartitionUtils$;
import org.apache.spark.sql.execution.streaming.state.OperatorStateMetadata;
import org.apache.spark.sql.execution.streaming.state.PrefixKeyScanStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StatePartitionKeyExtractor;
import org.apache.spark.sql.execution.streaming.state.StateSchemaCompatibilityChecker;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreColFamilySchema;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetadata;
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.execution.streaming.utils.StreamingUtils$;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.SerializableConfiguration;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Offline repartitioning of a stopped ring-backed query: Spark's own
 * {@code OfflineStateRepartitionRunner} steps, with the state moved through the ring provider.
 *
 * <p>If the last committed batch is {@code C} and the last planned one {@code L}, the
 * repartition batch is {@code L + 1} (or {@code L} itself when {@code L} is an unfinished
 * repartition batch to the same count). Every store of every stateful operator is read at
 * version {@code C + 1}, each row sent to partition {@code pmod(murmur3(partitionKey), n)}
 * with Spark's own per-operator partition-key extractor (the hash Spark's shuffle uses for
 * that operator), and written as version {@code batch + 1} of the new partitions. Only then
 * does the checkpoint change: the offset log entry of the batch (the last committed one's,
 * with the new {@code spark.sql.shuffle.partitions}) and its commit. Until that commit the
 * new versions are invisible: a query restarted at the old count reads version {@code C + 1}
 * and commits its own {@code C + 2} over them. A failure after the checkpoint's first change
 * takes its entries back (the skipped batches' empty commits, the offset entry), so the query
 * stays restartable at the old count. Only a crash between those few small file writes leaves
 * an unfinished repartition batch: the next run of this tool, to any count, finishes or
 * removes it.
 */
public final class Repartition {
  private static final Logger LOG = LoggerFactory.getLogger(Repartition.class);
  private static final String PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass";
  private static final String JOIN_FORMAT = "spark.sql.streaming.join.stateFormatVersion";
  private static final int SEED = 42; // Murmur3Hash's seed in HashPartitioning
  private static final AtomicLong DONE = new AtomicLong();
  private static final AtomicLong TOTAL = new AtomicLong();

  private Repartition() {}

  /** Stores moved so far and stores to move in the running repartition ({@code "done/total"}). */
  public static String progress() {
    return DONE.get() + "/" + TOTAL.get();
  }

  /**
   * Repartition the checkpoint's state to {@code numPartitions}; returns the repartition
   * batch's id. {@code enforceExactlyOnceSink}: refuse when the last batch did not commit
   * (else its input is read again by the next run, as Spark's own runner does).
   */
  public static long run(
      SparkSession spark, String checkpointLocation, int numPartitions,
      boolean enforceExactlyOnceSink, int threads) throws Exception {
    if (numPartitions <= 0) {
      throw OfflineStateRepartitionErrors$.MODULE$.parameterIsNotGreaterThanZeroError(
          "numPartitions");
    }
    Configuration hadoopConf = spark.sessionState().newHadoopConf();
    String cp = StreamingUtils$.MODULE$.resolvedCheckpointLocation(hadoopConf, checkpointLocation);
    StreamingQueryCheckpointMetadata meta = new StreamingQueryCheckpointMetadata(
        spark, cp, StreamingQueryCheckpointMetadata.$lessinit$greater$default$3());
    Option<Object> committedOpt = meta.commitLog().getLatestBatchId();
    if (committedOpt.isEmpty()) {
      throw OfflineStateRepartitionErrors$.MODULE$.noCommittedBatchError(checkpointLocation);
    }
    Option<Object> lastOpt = meta.offsetLog().getLatestBatchId();
    if (lastOpt.isEmpty()) {
      throw OfflineStateRepartitionErrors$.MODULE$.noBatchFoundError(checkpointLocation);
    }
    long committed = (Long) committedOpt.get();
    long last = (Long) lastOpt.get();
    OffsetSeqBase base = meta.offsetLog().get(committed).getOrElse(() -> {
      throw OfflineStateRepartitionErrors$.MODULE$.offsetSeqNotFoundError(
          checkpointLocation, committed);
    });
    OffsetSeqMetadataBase baseMeta = base.metadataOpt().getOrElse(() -> {
      throw OfflineStateRepartitionErrors$.MODULE$.missingOffsetSeqMetadataError(
          checkpointLocation, 1, committed);
    });
    String provider = confOf(baseMeta, PROVIDER_KEY, "");
    if (!provider.equals(RingStateStoreProvider.class.getName())) {
      throw new IllegalArgumentException("statestore repartition: the query at "
          + checkpointLocation + " keeps its state with " + (provider.isEmpty()
              ? "Spark's default provider" : provider)
          + ", not " + RingStateStoreProvider.class.getName()
          + ": use spark._streamingCheckpointManager.repartition for Spark's RocksDB provider");
    }
    int current = shufflePartitions(baseMeta);

    long batch;
    boolean reuse = false;
    if (last == committed) {
      batch = last + 1;
    } else if (OfflineStateRepartitionUtils$.MODULE$.isRepartitionBatch(last, meta.offsetLog())) {
      // an unfinished repartition (ours, or Spark's own refused one): nothing committed it, so
      // redo it to the same count, or take it back and plan a new one
      int planned = shufflePartitions(meta.offsetLog().get(last).get().metadataOpt().get());
      if (planned == numPartitions) {
        batch = last;
        reuse = true;
      } else {
        if (enforceExactlyOnceSink && last - 1 > committed) {
          throw OfflineStateRepartitionErrors$.MODULE$.lastBatchFailedError(
              checkpointLocation, last - 1);
        }
        LOG.warn("removing the unfinished repartition batch {} (to {} partitions) of {}", last,
            planned, cp);
        meta.offsetLog().purgeAfter(last - 1);
        batch = last;
      }
    } else if (enforceExactlyOnceSink) {
      throw OfflineStateRepartitionErrors$.MODULE$.lastBatchFailedError(checkpointLocation, last);
    } else {
      batch = last + 1; // the batches after the last commit are skipped (committed empty)
    }
    if (!reuse && current == numPartitions) {
      throw OfflineStateRepartitionErrors$.MODULE$.shufflePartitionsAlreadyMatchError(
          checkpointLocation, committed, numPartitions);
    }

    SQLConf sqlConf = spark.sessionState().conf().clone();
    OffsetSeqMetadata.setSessionConf(baseMeta, sqlConf);
    StateStoreConf storeConf = StateStoreConf.apply(sqlConf);
    Option<Object> joinFormat = Option.apply((Object) Integer.parseInt(confOf(baseMeta, JOIN_FORMAT, "2")));
    OperatorStateMetadata[] operators = new StateMetadataPartitionReader(
        cp, new SerializableConfiguration(hadoopConf), committed).allOperatorStateMetadata();
    if (operators.length == 0) {
      throw new IllegalStateException("statestore repartition: " + checkpointLocation
          + " has no operator metadata at batch " + committed + " (a stateless query, or one "
          + "last run by a Spark without operator metadata): nothing to repartition");
    }
    String stateRoot = new Path(cp, "state").toString();
    List<Move> moves = new ArrayList<>();
    for (OperatorStateMetadata op : operators) {
      for (StateStoreMetadata store : CollectionConverters.asJava(op.stateStoresMetadata())) {
        moves.add(new Move(stateRoot, op.operatorInfo().operatorId(),
            op.operatorInfo().operatorName(), store, hadoopConf, joinFormat));
      }
    }
    DONE.set(0);
    TOTAL.set(moves.size());
    long readVersion = committed + 1;
    ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, threads));
    try {
      for (Move m : moves) {
        m.run(pool, storeConf, hadoopConf, current, numPartitions, readVersion, batch);
        DONE.incrementAndGet();
      }
    } finally {
      pool.shutdownNow();
    }

    boolean offsetWritten = false;
    boolean skipped = false;
    try {
      if (!reuse) {
        for (long b = committed + 1; b < batch; b++) {
          skipped = true;
          if (!meta.commitLog().add(b, CommitMetadata.apply(0L))) {
            throw new IllegalStateException("statestore repartition: the commit of batch " + b
                + " of " + checkpointLocation + " appeared while repartitioning: is the query "
                + "running?");
          }
        }
        if (!meta.offsetLog().add(batch, withPartitions(base, numPartitions))) {
          throw new IllegalStateException("statestore repartition: batch " + batch + " of "
              + checkpointLocation + " appeared while repartitioning: is the query running?");
        }
        offsetWritten = true;
      }
      if (!meta.commitLog().add(batch, meta.commitLog().get(committed).get())) {
        throw new IllegalStateException("statestore repartition: the commit of batch " + batch
            + " of " + checkpointLocation + " appeared while repartitioning: is the query running?");
      }
    } catch (Exception | Error e) {
      if (offsetWritten) {
        meta.offsetLog().purgeAfter(batch - 1);
      }
      if (skipped) {
        meta.commitLog().purgeAfter(committed);
      }
      throw e;
    }
    LOG.info("repartitioned {} from {} to {} partitions in batch {} ({} stores)", cp, current,
        numPartitions, batch, moves.size());
    return batch;
  }

  private static String confOf(OffsetSeqMetadataBase meta, String key, String dflt) {
    Option<String> v = meta.conf().get(key);
    return v.isDefined() ? v.get() : dflt;
  }

  private static int shufflePartitions(OffsetSeqMetadataBase meta) {
    return (Integer) OfflineStateRepartitionUtils$.MODULE$.getShufflePartitions(meta).get();
  }

  private static OffsetSeqBase withPartitions(OffsetSeqBase base, int n) {
    String key = SQLConf.SHUFFLE_PARTITIONS().key();
    if (base instanceof OffsetSeq) {
      OffsetSeq v1 = (OffsetSeq) base;
      OffsetSeqMetadata m = v1.metadataOpt().get();
      return v1.copy(v1.offsets(), Option.apply(
          m.copy(m.batchWatermarkMs(), m.batchTimestampMs(), m.conf().updated(key, "" + n))));
    }
    if (base instanceof OffsetMap) {
      OffsetMap v2 = (OffsetMap) base;
      OffsetSeqMetadataV2 m = v2.metadata();
      return v2.copy(v2.offsetsMap(), m.copy(m.batchWatermarkMs(), m.batchTimestampMs(),
          m.conf().updated(key, "" + n), m.sourceMetadataInfo(), m.controlBatchInfo()));
    }
    throw OfflineStateRepartitionErrors$.MODULE$.unsupportedOffsetSeqVersionError(
        base.toString(), -1);
  }

  /** One store of one operator: its rows read from every old partition, re-split, written. */
  private static final class Move {
    final String stateRoot;
    final long operatorId;
    final String storeName;
    final StructType keySchema;
    final StructType valueSchema;
    final int prefixCols;
    final String operatorName;
    final Option<Object> joinFormat;

    Move(String stateRoot, long operatorId, String operatorName, StateStoreMetadata store,
        Configuration hadoopConf, Option<Object> joinFormat) {
      this.stateRoot = stateRoot;
      this.operatorId = operatorId;
      this.storeName = store.storeName();
      this.prefixCols = store.numColsPrefixKey();
      StateStoreId schemaStore = new StateStoreId(
          stateRoot, operatorId, StateStore.PARTITION_ID_TO_CHECK_SCHEMA(), storeName);
      List<StateStoreColFamilySchema> schemas;
      try {
        schemas = CollectionConverters.asJava(new StateSchemaCompatibilityChecker(
            new StateStoreProviderId(schemaStore, UUID.randomUUID()), hadoopConf,
            StateSchemaCompatibilityChecker.$lessinit$greater$default$3(),
            StateSchemaCompatibilityChecker.$lessinit$greater$default$4(),
            StateSchemaCompatibilityChecker.$lessinit$greater$default$5()).readSchemaFile());
      } catch (RuntimeException e) {
        throw new IllegalStateException("statestore repartition: cannot read the state schema "
            + "of operator " + operatorId + " store " + storeName + " under " + stateRoot
            + " (" + e.getMessage() + "): run the query once, then repartition", e);
      }
      StateStoreColFamilySchema schema = schemas.get(0);
      this.keySchema = schema.keySchema();
      this.valueSchema = schema.valueSchema();
      this.operatorName = operatorName;
      this.joinFormat = joinFormat;
      extractor(); // an operator Spark cannot re-split fails here, before anything is written
    }

    /** Spark's partition-key extractor for this store: one per thread (it reuses its row). */
    StatePartitionKeyExtractor extractor() {
      return StatePartitionKeyExtractorFactory$.MODULE$.create(operatorName, keySchema,
          storeName, StateStore.DEFAULT_COL_FAMILY_NAME(), joinFormat, Option.empty());
    }

    RingStateStoreProvider provider(
        int partition, StateStoreConf storeConf, Configuration hadoopConf) {
      KeyStateEncoderSpec spec = prefixCols > 0
          ? new PrefixKeyScanStateEncoderSpec(keySchema, prefixCols)
          : new NoPrefixKeyStateEncoderSpec(keySchema);
      RingStateStoreProvider p = new RingStateStoreProvider();
      p.init(new StateStoreId(stateRoot, operatorId, partition, storeName), keySchema,
          valueSchema, spec, false, storeConf, hadoopConf, false, Option.empty());
      return p;
    }

    void run(ExecutorService pool, StateStoreConf storeConf, Configuration hadoopConf,
        int oldCount, int newCount, long readVersion, long batch) throws Exception {
      List<List<UnsafeRow[]>> out = new ArrayList<>();
      for (int i = 0; i < newCount; i++) {
        out.add(new ArrayList<>());
      }
      List<Future<List<List<UnsafeRow[]>>>> reads = new ArrayList<>();
      for (int p = 0; p < oldCount; p++) {
        final int part = p;
        reads.add(pool.submit(() -> read(part, storeConf, hadoopConf, newCount, readVersion)));
      }
      for (Future<List<List<UnsafeRow[]>>> f : reads) {
        List<List<UnsafeRow[]>> split = get(f);
        for (int i = 0; i < newCount; i++) {
          out.get(i).addAll(split.get(i));
        }
      }
      List<Future<Long>> writes = new ArrayList<>();
      for (int p = 0; p < newCount; p++) {
        final int part = p;
        final List<UnsafeRow[]> rows = out.get(p);
        writes.add(pool.submit(() -> write(part, rows, storeConf, hadoopConf, batch)));
      }
      for (Future<Long> f : writes) {
        long v = get(f);
        if (v != batch + 1) {
          throw new IllegalStateException("statestore repartition: operator " + operatorId
              + " store " + storeName + " committed version " + v + ", expected " + (batch + 1));
        }
      }
    }

    private List<List<UnsafeRow[]>> read(int part, StateStoreConf storeConf,
        Configuration hadoopConf, int newCount, long version) {
      List<List<UnsafeRow[]>> split = new ArrayList<>();
      for (int i = 0; i < newCount; i++) {
        split.add(new ArrayList<>());
      }
      StatePartitionKeyExtractor extractor = extractor();
      RingStateStoreProvider p = provider(part, storeConf, hadoopConf);
      try {
        ReadStateStore store = p.getReadStore(version, Option.empty());
        try {
          StateStoreIterator<UnsafeRowPair> it = store.iterator(StateStore.DEFAULT_COL_FAMILY_NAME());
          while (it.hasNext()) {
            UnsafeRowPair pair = it.next();
            UnsafeRow key = pair.key().copy();
            UnsafeRow value = pair.value().copy();
            UnsafeRow pk = extractor.partitionKey(key);
            int h = (int) Murmur3HashFunction$.MODULE$.hash(pk, extractor.partitionKeySchema(), SEED);
            split.get(Math.floorMod(h, newCount)).add(new UnsafeRow[] {key, value});
          }
        } finally {
          store.release();
        }
      } finally {
        p.close();
      }
      return split;
    }

    private long write(int part, List<UnsafeRow[]> rows, StateStoreConf storeConf,
        Configuration hadoopConf, long batch) {
      RingStateStoreProvider p = provider(part, storeConf, hadoopConf);
      try {
        StateStore store = p.getStore(batch, Option.empty(), true, true);
        try {
          for (UnsafeRow[] kv : rows) {
            store.put(kv[0], kv[1], StateStore.DEFAULT_COL_FAMILY_NAME());
          }
          return store.commit();
        } catch (RuntimeException e) {
          store.abort();
          throw e;
        }
      } finally {
        p.close();
      }
    }
  }

  private static <T> T get(Future<T> f) throws Exception {
    try {
      return f.get();
    } catch (ExecutionException e) {
      Throwable c = e.getCause();
      throw c instanceof Exception ? (Exception) c : new RuntimeException(c);
    }
  }
}
