#!/usr/bin/env bash
# Builds the Kafka Streams contender (Maven Central) and prints the jar's path last.
set -euo pipefail
DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
command -v mvn >/dev/null || { apt-get update -qq && apt-get install -y -qq maven >/dev/null; }
mvn -q -B -f "$DIR/pom.xml" package -DskipTests >&2
printf '%s\n' "$DIR/target/kstreams-workload.jar"
