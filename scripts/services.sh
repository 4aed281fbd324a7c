#!/usr/bin/env bash
# Make sure the servers the tests talk to answer on 127.0.0.1: PostgreSQL, Redis, RabbitMQ.
# On the machines this project runs on they are started with the machine; elsewhere start them.
set -uo pipefail
wait_for() {  # name, check command
  for _ in $(seq 1 30); do
    if eval "$2" >/dev/null 2>&1; then echo "services: $1 is up"; return 0; fi
    sleep 1
  done
  echo "services: $1 does not answer on 127.0.0.1 (tests that need it will say so)" >&2
  return 0
}
if ! pg_isready -h 127.0.0.1 -q 2>/dev/null; then
  (command -v service >/dev/null && service postgresql start) >/dev/null 2>&1 || true
fi
wait_for PostgreSQL "pg_isready -h 127.0.0.1 -q"
if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  (command -v service >/dev/null && service redis-server start) >/dev/null 2>&1 || true
fi
wait_for Redis "exec 3<>/dev/tcp/127.0.0.1/6379"
if ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then
  (command -v service >/dev/null && service rabbitmq-server start) >/dev/null 2>&1 || true
fi
wait_for RabbitMQ "exec 3<>/dev/tcp/127.0.0.1/5672"
