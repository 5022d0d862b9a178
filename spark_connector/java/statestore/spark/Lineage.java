package statestore.spark;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Which manifests make up a chain, when replicas hold a version at several epochs: a port of
 * {@code statestore/core/manifest.py} ({@code candidates}, {@code lineage},
 * {@code resolve_chain}), rule for rule, so the direct path restores what Python's client and
 * the nodes restore (cross-checked on the same table by {@code tests/ring/test_java_codec.py}).
 *
 * <p>The <em>head</em> is the manifest of the highest (epoch, version); its <em>lineage</em> is
 * the head, then the manifest of version - 1 at its {@code base_epoch}, and so on down. A
 * version on the lineage resolves to the lineage's manifest of it (another epoch of it is a
 * dead branch: a refused or superseded writer's); a version off it to its highest epoch.
 * Below the version asked, each delta's {@code base_epoch} names the exact manifest of
 * version - 1 (one no replica answered with is "version not found", never another epoch's
 * state); a manifest naming none falls back to the highest epoch there. At one version and
 * epoch a snapshot is preferred to the delta.
 */
final class Lineage {
  private Lineage() {}

  /** A chain that cannot be resolved (Python's VersionNotFound, with its message). */
  static final class NotFoundException extends Exception {
    NotFoundException(String message) {
      super(message);
    }
  }

  /** Every manifest held, one per (version, kind, epoch), by kind and version. */
  static final class Candidates {
    final Map<Long, List<ManifestCodec.Manifest>> deltas = new HashMap<>();
    final Map<Long, List<ManifestCodec.Manifest>> snaps = new HashMap<>();
    private final Set<String> seen = new HashSet<>();

    /**
     * Add {@code m} unless a manifest of its version, kind and epoch is already in (the first
     * seen wins: replicas agree on a manifest's content at one epoch).
     */
    void add(ManifestCodec.Manifest m) {
      if (seen.add(m.version() + "/" + m.kind() + "/" + m.epoch())) {
        (m.isSnapshot() ? snaps : deltas).computeIfAbsent(m.version(), v -> new ArrayList<>()).add(m);
      }
    }

    static Candidates of(Iterable<ManifestCodec.Manifest> manifests) {
      Candidates c = new Candidates();
      for (ManifestCodec.Manifest m : manifests) {
        c.add(m);
      }
      return c;
    }

    List<ManifestCodec.Manifest> deltasAt(long version) {
      return deltas.getOrDefault(version, List.of());
    }

    List<ManifestCodec.Manifest> snapsAt(long version) {
      return snaps.getOrDefault(version, List.of());
    }

    boolean holds(long version) {
      return !deltasAt(version).isEmpty() || !snapsAt(version).isEmpty();
    }

    /**
     * The manifest of {@code version} at {@code epoch} ({@code null}: the highest epoch
     * held), a snapshot before the delta of the same epoch; {@code null} when there is none.
     */
    ManifestCodec.Manifest pick(long version, Long epoch) {
      List<ManifestCodec.Manifest> ss = snapsAt(version);
      List<ManifestCodec.Manifest> ds = deltasAt(version);
      long want;
      if (epoch == null) {
        if (ss.isEmpty() && ds.isEmpty()) {
          return null;
        }
        want = Long.MIN_VALUE;
        for (ManifestCodec.Manifest m : ss) {
          want = Math.max(want, m.epoch());
        }
        for (ManifestCodec.Manifest m : ds) {
          want = Math.max(want, m.epoch());
        }
      } else {
        want = epoch;
      }
      for (ManifestCodec.Manifest m : ss) {
        if (m.epoch() == want) {
          return m;
        }
      }
      for (ManifestCodec.Manifest m : ds) {
        if (m.epoch() == want) {
          return m;
        }
      }
      return null;
    }

    /** The delta of {@code version} at exactly {@code epoch}, or {@code null}. */
    ManifestCodec.Manifest delta(long version, long epoch) {
      for (ManifestCodec.Manifest m : deltasAt(version)) {
        if (m.epoch() == epoch) {
          return m;
        }
      }
      return null;
    }

    /** The snapshot of {@code version} at exactly {@code epoch}, or {@code null}. */
    ManifestCodec.Manifest snapshot(long version, long epoch) {
      for (ManifestCodec.Manifest m : snapsAt(version)) {
        if (m.epoch() == epoch) {
          return m;
        }
      }
      return null;
    }

    /**
     * The base epoch of {@code m}; a snapshot written without one (by compaction before
     * base_epoch existed) takes its delta's, which has the same version and epoch.
     */
    Long baseOf(ManifestCodec.Manifest m) {
      if (m.baseEpoch() != null || !m.isSnapshot()) {
        return m.baseEpoch();
      }
      ManifestCodec.Manifest d = delta(m.version(), m.epoch());
      return d == null ? null : d.baseEpoch();
    }

    /**
     * The head's line of descent, version to epoch: the head (the manifest of the highest
     * (epoch, version)), then each manifest's base, down to the first version whose base is
     * not held.
     */
    Map<Long, Long> lineage() {
      ManifestCodec.Manifest top = null;
      for (Map<Long, List<ManifestCodec.Manifest>> t : List.of(deltas, snaps)) {
        for (List<ManifestCodec.Manifest> ms : t.values()) {
          for (ManifestCodec.Manifest m : ms) {
            if (top == null || m.epoch() > top.epoch()
                || (m.epoch() == top.epoch() && m.version() > top.version())) {
              top = m;
            }
          }
        }
      }
      Map<Long, Long> out = new HashMap<>();
      if (top == null) {
        return out;
      }
      long v = top.version();
      ManifestCodec.Manifest m = pick(v, top.epoch());
      while (m != null) {
        out.put(v, m.epoch());
        v--;
        m = v >= 1 ? pick(v, baseOf(m)) : null;
      }
      return out;
    }

    /**
     * The epoch a restore of {@code version} takes: the lineage's, else the highest held
     * ({@code null} when no manifest of it is held).
     */
    Long epochAt(long version) {
      Long e = lineage().get(version);
      if (e != null) {
        return e;
      }
      ManifestCodec.Manifest m = pick(version, null);
      return m == null ? null : m.epoch();
    }

    /**
     * The manifests to apply, oldest first, to rebuild {@code version} of {@code store}
     * (Python's {@code resolve_chain}, with its messages).
     */
    List<ManifestCodec.Manifest> resolve(String store, long version) throws NotFoundException {
      List<ManifestCodec.Manifest> chain = new ArrayList<>();
      long v = version;
      Long epoch = lineage().get(version);
      while (v >= 1) {
        ManifestCodec.Manifest m = pick(v, epoch);
        if (m == null) {
          if (v == version) {
            throw new NotFoundException("store " + store + " has no version " + version
                + ": list versions with versions() and restore one of them");
          }
          if (epoch != null && holds(v)) {
            throw new NotFoundException("store " + store + " version " + version
                + " needs version " + v + " as written at epoch " + epoch + ", which no replica"
                + " that answered holds: retry once the ring has repaired, or restore a newer"
                + " version");
          }
          throw new NotFoundException("store " + store + " version " + version + " needs version "
              + v + ", which is gone (past retention or never committed): restore a newer version");
        }
        chain.add(m);
        if (m.isSnapshot()) {
          break;
        }
        epoch = m.baseEpoch();
        v--;
      }
      Collections.reverse(chain);
      return chain;
    }
  }
}
