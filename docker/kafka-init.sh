#!/usr/bin/env bash
# One-shot set-up of the compose stack's broker (service kafka-init, apache/kafka image, run as root, then done):
#  1. a throwaway CA signs the broker's TLS key (its names: kafka, localhost, 127.0.0.1); the CA's private key is
#     deleted once it signed, so nothing else can ever be signed by it. Broker files go to /etc/kafka/secrets
#     (the kafka service's volume only); the public CA certificate to /kafka-ca (readable by the worker and the host);
#     the worker's password to /worker-secrets (a file only the streamproc image's user reads).
#  2. the storage is formatted with the SCRAM-SHA-512 users: worker, operator (the host's commands) and the
#     broker itself (its own inter-broker login, a random password that never leaves the secrets volume).
# Both steps run once: a second `up` finds the files and leaves them, so a password changed in .env later does
# not change the broker's (rotate with kafka-configs.sh: docs/security.md).
set -euo pipefail

# the image's paths; tests/integration/test_compose_broker.py runs this script outside Docker with its own
secrets=${KAFKA_INIT_SECRETS_DIR:-/etc/kafka/secrets}
ca_dir=${KAFKA_INIT_CA_DIR:-/kafka-ca}
data=${KAFKA_INIT_DATA_DIR:-/var/lib/kafka/data}
storage_tool=${KAFKA_INIT_STORAGE_TOOL:-/opt/kafka/bin/kafka-storage.sh}
worker_secrets=${KAFKA_INIT_WORKER_SECRETS_DIR:-/worker-secrets}

# SCRAM users are written by `kafka-storage.sh format --add-scram 'SCRAM-SHA-512=[name=...,password=...]'`,
# whose parser splits on , = [ ] and quotes: a password is refused here rather than cut there.
check_password() {
  if [[ ! "$2" =~ ^[A-Za-z0-9._~-]{12,}$ ]]; then
    echo "kafka-init: $1 must be at least 12 characters of A-Z a-z 0-9 . _ ~ - (set it in .env)" >&2
    exit 1
  fi
}
check_password KAFKA_WORKER_PASSWORD "${WORKER_PASSWORD:-}"
check_password KAFKA_OPERATOR_PASSWORD "${OPERATOR_PASSWORD:-}"

random_secret() { head -c 2048 /dev/urandom | tr -dc 'A-Za-z0-9' | head -c 32; }

if [[ ! -s "$secrets/broker.keystore.p12" ]]; then
  echo "kafka-init: making a throwaway CA and the broker's TLS keystore"
  work=$(mktemp -d)
  ca_pass=$(random_secret)
  store_pass=$(random_secret)
  keytool -genkeypair -alias ca -dname "CN=streamproc compose CA" -keyalg RSA -keysize 3072 -validity 825 \
    -ext bc:c -ext KU:c=keyCertSign,cRLSign -keystore "$work/ca.p12" -storetype PKCS12 -storepass "$ca_pass" -noprompt
  keytool -exportcert -rfc -alias ca -keystore "$work/ca.p12" -storepass "$ca_pass" >"$work/ca.pem"
  keytool -genkeypair -alias kafka -dname "CN=kafka" -keyalg RSA -keysize 3072 -validity 825 \
    -keystore "$work/broker.keystore.p12" -storetype PKCS12 -storepass "$store_pass" -noprompt
  keytool -certreq -alias kafka -keystore "$work/broker.keystore.p12" -storepass "$store_pass" \
    | keytool -gencert -alias ca -keystore "$work/ca.p12" -storepass "$ca_pass" -rfc -validity 825 \
        -ext SAN=dns:kafka,dns:localhost,ip:127.0.0.1 -ext KU=digitalSignature,keyEncipherment -ext EKU=serverAuth \
        >"$work/kafka.pem"
  keytool -importcert -alias ca -file "$work/ca.pem" -keystore "$work/broker.keystore.p12" \
    -storepass "$store_pass" -noprompt
  keytool -importcert -alias kafka -file "$work/kafka.pem" -keystore "$work/broker.keystore.p12" \
    -storepass "$store_pass" -noprompt
  # the image's configure script reads the keystore and key passwords from these files
  printf '%s' "$store_pass" >"$secrets/broker_keystore_creds"
  printf '%s' "$store_pass" >"$secrets/broker_key_creds"
  cp "$work/ca.pem" "$secrets/ca.pem"
  cp "$work/ca.pem" "$ca_dir/ca.pem"
  mv "$work/broker.keystore.p12" "$secrets/broker.keystore.p12"
  rm -rf "$work"  # the CA's private key with it
fi

if [[ -s "$data/meta.properties" && ! -s "$secrets/kafka_server_jaas.conf" ]]; then
  echo "kafka-init: the kafka-data volume was formatted without SCRAM users (an older stack); start afresh with" \
    "docker compose down -v (this deletes its topics)" >&2
  exit 1
fi
if [[ ! -s "$data/meta.properties" ]]; then
  echo "kafka-init: formatting the storage with the SCRAM users worker, operator and broker"
  broker_pass=$(random_secret)
  # the broker's own login on its SASL_SSL inter-broker listener; KafkaServer serves every listener
  cat >"$secrets/kafka_server_jaas.conf" <<EOF
KafkaServer {
  org.apache.kafka.common.security.scram.ScramLoginModule required
  username="broker"
  password="$broker_pass";
};
EOF
  # the healthcheck's client settings (the broker's own user)
  cat >"$secrets/healthcheck.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="$broker_pass";
ssl.truststore.type=PEM
ssl.truststore.location=$secrets/ca.pem
EOF
  # just what format needs; the kafka service's environment holds the broker's real settings
  voters=${KAFKA_CONTROLLER_QUORUM_VOTERS:?}
  format_config=$(mktemp)
  cat >"$format_config" <<EOF
process.roles=broker,controller
node.id=${KAFKA_NODE_ID:?}
controller.quorum.voters=$voters
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:19099,CONTROLLER://${voters#*@}
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$data
EOF
  "$storage_tool" format --cluster-id "${CLUSTER_ID:?}" -c "$format_config" \
    --add-scram "SCRAM-SHA-512=[name=worker,password=$WORKER_PASSWORD]" \
    --add-scram "SCRAM-SHA-512=[name=operator,password=$OPERATOR_PASSWORD]" \
    --add-scram "SCRAM-SHA-512=[name=broker,password=$broker_pass]"
  rm -f "$format_config"
fi

# the workers' password as a file (STREAMPROC_KAFKA_SASL_PASSWORD_FILE): out of their environment, so out of
# `docker inspect`; rewritten on every run, so it follows .env (the broker's credential does not: rotation)
printf '%s' "$WORKER_PASSWORD" >"$worker_secrets/kafka-sasl-password"
chmod 0400 "$worker_secrets/kafka-sasl-password"
if id appuser >/dev/null 2>&1; then
  chown 10001 "$worker_secrets/kafka-sasl-password"  # the streamproc image's user (docker/Dockerfile)
fi

# the broker runs as the image's appuser; only it reads the secrets; the CA certificate is public
if id appuser >/dev/null 2>&1; then  # the image's user (absent outside the image)
  chown -R appuser:root "$secrets" "$data"
fi
chmod 0700 "$secrets"
chmod 0600 "$secrets"/*
chmod 0755 "$ca_dir"
chmod 0644 "$ca_dir/ca.pem"
echo "kafka-init: done"
