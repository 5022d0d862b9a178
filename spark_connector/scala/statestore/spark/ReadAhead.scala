package statestore.spark

import scala.collection.mutable.ArrayBuffer

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.{SparkSessionExtensions, SparkSessionExtensionsProvider}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, SortOrder, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.plans.physical.Partitioning
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.execution.{ColumnarRule, SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.streaming.operators.stateful.{StateStoreRestoreExec, StatefulOperatorStateInfo}
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.apache.spark.sql.internal.SQLConf

/**
 * Found by Spark's service loader in the provider's jar
 * (`META-INF/services/org.apache.spark.sql.SparkSessionExtensionsProvider`), so that no
 * `spark.sql.extensions` a user set is replaced: a streaming aggregation reads each key of a batch from its state store one `get` at a
 * time, so a lazily restored partition on the ring costs one block read per key not yet
 * held. The rule puts a [[ReadAheadExec]] under each `StateStoreRestoreExec` of a query on
 * the ring's provider: it takes the batch's rows a window at a time and hands their keys to
 * the provider first, which brings what the base holds of them in a few lookups
 * (`LazyBase.readAhead`), before the restore asks for them one by one.
 */
class RingExtensions extends SparkSessionExtensionsProvider {
  override def apply(e: SparkSessionExtensions): Unit = e.injectColumnar(_ => ReadAheadRule)
}

/** Inserted before the physical plan's columnar transitions (a streaming plan's too). */
object ReadAheadRule extends ColumnarRule {
  override def preColumnarTransitions: Rule[SparkPlan] = new Rule[SparkPlan] {
    override def apply(plan: SparkPlan): SparkPlan =
      if (!enabled) plan
      else plan.transformUp {
        case r: StateStoreRestoreExec
            if r.stateInfo.isDefined && !r.child.isInstanceOf[ReadAheadExec] =>
          r.withNewChildren(Seq(ReadAheadExec(r.keyExpressions, r.stateInfo.get, r.child)))
      }
  }

  /** On the ring's provider, with lazy restores (a whole version has nothing to read ahead). */
  private def enabled: Boolean = {
    val conf = SQLConf.get
    def flag(name: String, default: String) =
      conf.getConfString(s"spark.statestore.$name", default).trim.toLowerCase
    conf.getConfString("spark.sql.streaming.stateStore.providerClass", "") ==
      classOf[RingStateStoreProvider].getName &&
      flag("lazyRestore", "false") == "true" && flag("readAhead", "true") != "false"
  }
}

/**
 * Its child's rows, unchanged and in order; a window of them at a time (at most
 * `readAheadRows` rows and `readAheadBytes` bytes, copied) whose keys are handed to the
 * partition's provider before the window is given on ([[RingStateStoreProvider.readAhead]]).
 */
case class ReadAheadExec(keys: Seq[Attribute], info: StatefulOperatorStateInfo, child: SparkPlan)
    extends UnaryExecNode {
  override def output: Seq[Attribute] = child.output
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def outputOrdering: Seq[SortOrder] = child.outputOrdering

  override protected def doExecute(): RDD[InternalRow] = {
    val (ks, out, i) = (keys, child.output, info)
    child.execute().mapPartitionsWithIndex { (partition, rows) =>
      ReadAheadExec.windows(i, partition, UnsafeProjection.create(ks, out), rows)
    }
  }

  override protected def withNewChildInternal(c: SparkPlan): ReadAheadExec = copy(child = c)
}

object ReadAheadExec {
  def windows(
      info: StatefulOperatorStateInfo,
      part: Int,
      key: UnsafeProjection,
      rows: Iterator[InternalRow]): Iterator[InternalRow] = {
    val id = StateStoreId(info.checkpointLocation, info.operatorId, part, StateStoreId.DEFAULT_STORE_NAME)
    windows(id, info.storeVersion, key, rows)
  }

  private def windows(
      id: StateStoreId,
      version: Long,
      key: UnsafeProjection,
      rows: Iterator[InternalRow]): Iterator[InternalRow] = new Iterator[InternalRow] {
    private var window: Array[InternalRow] = Array.empty
    private var at = 0
    /** Once the version has nothing to read ahead (held whole): the rows as they come. */
    private var through = false

    override def hasNext: Boolean =
      at < window.length || (if (through) rows.hasNext else fill())

    override def next(): InternalRow = {
      if (!hasNext) throw new NoSuchElementException("no more rows")
      if (at < window.length) {
        val r = window(at)
        at += 1
        r
      } else rows.next()
    }

    private def fill(): Boolean = {
      if (!rows.hasNext) return false
      if (!RingStateStoreProvider.readsAhead(id, version)) { // no copies of a window for nothing
        through = true
        window = Array.empty
        at = 0
        return true
      }
      val most = RingStateStoreProvider.readAheadRows()
      val bytes = RingStateStoreProvider.readAheadBytes()
      val taken = new ArrayBuffer[InternalRow](most)
      val keys = new java.util.ArrayList[UnsafeRow](most)
      var size = 0L
      while (taken.length < most && size < bytes && rows.hasNext) {
        val r = rows.next().copy()
        taken += r
        val k = key(r).copy()
        keys.add(k)
        size += k.getSizeInBytes + (r match {
          case u: UnsafeRow => u.getSizeInBytes.toLong
          case _ => 512L
        })
      }
      RingStateStoreProvider.readAhead(id, version, keys)
      window = taken.toArray
      at = 0
      true
    }
  }
}
