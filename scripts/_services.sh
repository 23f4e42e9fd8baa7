# Sourced by scripts/test: make sure the services the suite talks to are there, or stop at once
# with the one command that fixes it.
#   ensure_redis     start redis-server on 127.0.0.1:6379 when it is installed but not running
#   ensure_chromium  install Debian's chromium for the browser test (root + apt-get), else say how

ensure_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    return 0
  fi
  if command -v redis-server >/dev/null 2>&1; then
    echo "==> starting redis-server on 127.0.0.1:6379 (in memory, no persistence)"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
    for _ in $(seq 50); do redis-cli ping >/dev/null 2>&1 && return 0; sleep 0.1; done
    echo "error: redis-server did not answer on 127.0.0.1:6379; see its log, or run: redis-server" >&2
    return 1
  fi
  if [ -n "${INFAAS_REQUIRE_REDIS:-}" ] && [ "${INFAAS_REQUIRE_REDIS}" != "0" ]; then
    echo "error: Redis is required (INFAAS_REQUIRE_REDIS) but not installed; run: sudo apt-get install -y redis-server" >&2
    return 1
  fi
  echo "==> no redis-server here: the Redis tests will be skipped (sudo apt-get install -y redis-server runs them)"
}

ensure_chromium() {
  [ -x /usr/bin/chromium ] && return 0
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "==> installing Debian's chromium for the browser test (once)"
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
      return 0
    fi
  fi
  echo "error: the browser test needs /usr/bin/chromium; run: sudo apt-get install -y chromium" >&2
  echo "       (or skip it: scripts/test -m 'not browser')" >&2
  return 1
}
