#!/usr/bin/env bash
# Builds the Apache Flink contender (Maven Central) and prints, last, the classpath to run
# it with: java -cp "$(bench/flink/build.sh | tail -n1)" streamstate.bench.flink.Workload ...
#   bench/flink/build.sh [--compile-only]   (CI: compile, print nothing)
set -euo pipefail
DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
command -v mvn >/dev/null || { apt-get update -qq && apt-get install -y -qq maven >/dev/null; }
mvn -q -B -Dstyle.color=never -f "$DIR/pom.xml" compile \
    dependency:build-classpath -Dmdep.outputFile="$DIR/target/classpath.txt" >&2
[[ "${1:-}" == "--compile-only" ]] && exit 0
printf '%s:%s\n' "$DIR/target/classes" "$(cat "$DIR/target/classpath.txt")"
