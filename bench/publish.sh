#!/usr/bin/env bash
# Publishes per second through the backend API into a room of 1,000 members,
# over one keep-alive connection and over four (bench/publish.py), on the
# release build; the table goes to stdout and bench/results/publish-latest.md.
#
#   bench/publish.sh                          1,000 members, 1 and 4 connections, 5 s each
#   MEMBERS=5000 CONNECTIONS=1,8 bench/publish.sh
source "$(dirname "$0")/lib.sh"

build
mkdir -p "$RESULTS"
python3 "$ROOT/bench/publish.py" --roomcastd "$BIN/roomcastd" --members "${MEMBERS:-1000}" \
    --connections "${CONNECTIONS:-1,4}" --seconds "${SECONDS_EACH:-5}" | tee "$RESULTS/publish-latest.md"
