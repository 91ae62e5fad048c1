# Two commands for a newcomer: `make demo` and `make test`. Both bootstrap a virtualenv from
# pyproject.toml on first use (and again whenever pyproject.toml changes): `make demo` installs
# only what the demo needs (the package and its runtime dependencies), `make test` adds the dev
# extra (test, lint and type-check tools). tools/bootstrap-venv.sh keeps the stamp.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BOOTSTRAP := sh tools/bootstrap-venv.sh "$(PYTHON)" "$(VENV)"

.PHONY: demo kafka-demo test check lint typecheck unit prereqs bench bench-delta-spark campaign clean runtime-venv dev-venv jars jvm-archive images compose

prereqs:
	@sh tools/check-prereqs.sh "$(PYTHON)"

runtime-venv:
	@$(BOOTSTRAP) runtime

dev-venv:
	@$(BOOTSTRAP) dev

demo: runtime-venv
	$(PY) examples/quickstart.py

# Kafka into Delta with a real broker (started and stopped by the demo; examples/kafka_to_delta.py).
kafka-demo: dev-venv jars
	$(PY) examples/kafka_to_delta.py

lint: dev-venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: dev-venv
	$(VENV)/bin/mypy

unit: dev-venv
	$(VENV)/bin/pytest -m "not spark and not integration"

# delta-spark's jars (built for the installed Spark, with delta-storage) and hadoop-aws (with the
# AWS SDK bundle), fetched with Maven once into ~/.cache/sparksink/jars (XDG_CACHE_HOME, or
# SPARKSINK_JARS_DIR) and reused offline after that: tools/jars.py. The tests run delta-spark
# in their SparkSession with them; `--print-classpath` gives them to spark-submit --jars.
jars: runtime-venv
	$(PY) tools/jars.py

# A class-data-sharing archive of the classes a test driver's JVM loads (committers/tests/
# _jvm_archive.py), made once per JVM, pyspark and jars: each of the suite's many Spark drivers
# then starts in about half the time. Not needed for correctness: without it JVMs start as usual.
jvm-archive: dev-venv jars
	$(PY) -m committers.tests._jvm_archive

# The container images of the tests (tools/containers.py), built on this machine, nothing pulled:
# the S3 server (SeaweedFS), the Kafka broker and Spark standalone nodes. Starts a Docker engine
# first where none answers and one can be had (as root with apt: Debian's docker.io); where none
# can, it says so and the tests run their servers as local processes. Reused until an input
# changes (each image's tag is a digest of its inputs).
images: dev-venv jars
	$(PY) tools/containers.py

# `docker compose` for docker/docker-compose.yml where the engine came without it (Debian's
# docker.io): built from the Go module proxy, installed as a Docker CLI plugin. Not for the tests.
compose:
	$(PY) tools/containers.py --compose

# Two pytest-xdist workers (one SparkSession each): the tests that kill processes (campaign,
# zombie drivers, executor loss, speculation, deploy) stay together in one worker
# (xdist_group "kills_processes") while the rest share both.
test: dev-venv lint typecheck jars jvm-archive images
	$(VENV)/bin/pytest -n 2 --dist loadgroup --durations=40

# The fast tier for the edit-test loop: lint, types, every unit test (those that need neither
# Spark nor a server nor many seconds: the engine-agnostic core, the codecs, the log writer, the
# async sinks against a real HTTP server) and one end-to-end test of each feature (marked
# `smoke`: appends and a killed driver, both stagings, upserts, overwrites, compaction, vacuum,
# reads, deletion vectors, the change data feed, the HTTP sink, S3, Kafka): 6.5 min on 2 cores.
# `make test` runs everything before a change lands.
check: dev-venv lint typecheck jars jvm-archive
	$(VENV)/bin/pytest -n 2 --dist loadgroup -q -m "(not spark and not integration and not slow) or smoke"

# The benchmarks start the S3 server and the throttling HTTP server of the test suite.
bench: dev-venv
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/commit_latency.py
	$(PY) benchmarks/commit_latency.py --s3
	$(PY) benchmarks/s3_staging.py
	$(PY) benchmarks/async_writer_overhead.py
	$(PY) benchmarks/async_congestion.py

# The sink against delta-spark (benchmarks/vs_delta_spark.py), side by side in one session: the
# bounded append, streaming, upserts into 1M/10M/30M rows (MERGE with deletion vectors off and
# on), compaction vs OPTIMIZE, scans, and appends on S3 through s3a. Needs `make jars`. Ratios
# are printed only on a quiet machine (1-minute load average <= 0.5).
bench-delta-spark: dev-venv jars
	$(PY) benchmarks/vs_delta_spark.py all

# The crash-point campaign (docs/reliability.md): SEED picks the kill plan, CYCLES the killed runs,
# STAGING auto|spark|arrow|mixed, SOURCE json|delta|changes|kafka|kafka-changes (JSON files, a
# Delta table read by the "deltalake" format, JSON changes upserted into a table with deletion
# vectors and the change data feed on, a topic on a local Kafka broker read by Spark's Kafka
# source, or the changes as Debezium-style events in such a topic); S3_FAULTS=0.1 puts the table on a local S3 server behind the fault proxy
# at that rate.
SEED ?= 1
CYCLES ?= 40
STAGING ?= auto
SOURCE ?= json
S3_FAULTS ?=
CAMPAIGN := build/campaign-$(SEED)-$(STAGING)-$(SOURCE)$(if $(S3_FAULTS),-s3)
campaign: dev-venv jars
	rm -rf $(CAMPAIGN)
	$(PY) -m committers.tests._campaign --seed $(SEED) --cycles $(CYCLES) --staging $(STAGING) \
		--source $(SOURCE) $(if $(S3_FAULTS),--s3-faults $(S3_FAULTS)) --workdir $(CAMPAIGN) \
		--json $(CAMPAIGN).json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
