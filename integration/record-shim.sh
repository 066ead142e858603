#!/usr/bin/env bash
# A shim that records what containerd gives `start` and what containerd reads back: it runs
# containerd-shim-runc-v2 with the same arguments and stdin and keeps what went in and came
# out, as $KT_RECORD_DIR/<task id>.stdin, .stdout and .stderr. Every other action is runc's
# shim's.
set -euo pipefail
action="${*: -1}"
if [ "${action}" != start ]; then
  exec containerd-shim-runc-v2 "$@"
fi
id=unknown
prev=""
for arg in "$@"; do
  if [ "${prev}" = -id ]; then id="${arg}"; fi
  prev="${arg}"
done
out="${KT_RECORD_DIR:?}/${id}"
cat > "${out}.stdin"
status=0
containerd-shim-runc-v2 "$@" < "${out}.stdin" > "${out}.stdout" 2> "${out}.stderr" || status=$?
cat "${out}.stdout"
cat "${out}.stderr" >&2
exit "${status}"
