"""JVM flags for the suite's short-lived Spark drivers and Java harnesses.

Each test starts a JVM that lives for a minute or less, so start-up and compilation dominate:
with the C1 compiler only and the serial collector (2 cores here), a Spark test job takes
about 30% less time, measured side by side on the same test. Benchmarks (``bench/``) keep
the JVM's defaults, as a user runs it.
"""

JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
