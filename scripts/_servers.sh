# Shared by scripts/test and scripts/trial: Postgres on 127.0.0.1:5432 (trust auth, user
# postgres) and Redis on 127.0.0.1:6379, started (and installed with apt) when not running;
# install_redis only installs redis-server (the trial runs one of its own).

ensure_postgres() {
  if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then return; fi
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    version="$(ls /etc/postgresql | sort -V | tail -1)"
    hba="/etc/postgresql/$version/main/pg_hba.conf"
    # Tests connect as postgres over loopback without a password, as on CI machines.
    sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "$hba"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start || true
  for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && return; sleep 0.5; done
  echo "Postgres did not come up on 127.0.0.1:5432" >&2; exit 1
}

install_redis() {
  if ! command -v redis-server >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
}

ensure_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return; fi
  install_redis
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 60); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && return; sleep 0.5; done
  echo "Redis did not come up on 127.0.0.1:6379" >&2; exit 1
}
