#!/usr/bin/env bash
# render.sh TEMPLATE [NAME=VALUE]...: prints TEMPLATE (containerd.toml, crio.conf or
# topology-guard.toml beside this script) with the values given. The rule, the same as
# integration/src/templates.rs: a line starting with `##` is dropped; a line starting with
# {{?NAME}} (one or more) is kept, without them, only when each NAME is given and not empty;
# {{NAME}} is NAME's value. A NAME not given where a value is needed, a name that is not
# [A-Z][A-Z0-9_]*, and a value holding a double quote, a backslash or a newline (it would break
# the TOML) are errors.
#
#   render.sh integration/templates/topology-guard.toml DELEGATE=containerd-shim-runc-v2 \
#     MODE=audit POLICY=restricted SYSFS=/sys STATE_DIR=/run/kata-topo LOG_FILE=/tmp/kt.log \
#     > kata-topo.toml
set -euo pipefail

template=${1:?usage: render.sh TEMPLATE [NAME=VALUE]...}
shift
declare -A values=()
for pair in "$@"; do
  name=${pair%%=*}
  value=${pair#*=}
  if [[ ${pair} != *=* || ! ${name} =~ ^[A-Z][A-Z0-9_]*$ ]]; then
    echo "render.sh: ${pair}: not NAME=VALUE with NAME in [A-Z][A-Z0-9_]*" >&2
    exit 2
  fi
  if [[ ${value} == *'"'* || ${value} == *\\* || ${value} == *$'\n'* ]]; then
    echo "render.sh: ${name}: a double quote, a backslash or a newline would break the TOML" >&2
    exit 2
  fi
  values[${name}]=${value}
done

while IFS= read -r line || [ -n "${line}" ]; do
  [[ ${line} == '##'* ]] && continue
  keep=1
  while [[ ${line} =~ ^\{\{\?([A-Z][A-Z0-9_]*)\}\}(.*)$ ]]; do
    [ -n "${values[${BASH_REMATCH[1]}]:-}" ] || keep=0
    line=${BASH_REMATCH[2]}
  done
  [ "${keep}" = 1 ] || continue
  out=""
  while [[ ${line} == *'{{'* ]]; do
    out+=${line%%'{{'*}
    rest=${line#*'{{'}
    name=${rest%%'}}'*}
    if [[ ${rest} != *'}}'* || ! ${name} =~ ^[A-Z][A-Z0-9_]*$ ]]; then
      echo "render.sh: ${template}: a malformed {{...}} in: ${line}" >&2
      exit 2
    fi
    if [ -z "${values[${name}]+given}" ]; then
      echo "render.sh: ${template}: ${name} is needed and was not given" >&2
      exit 2
    fi
    out+=${values[${name}]}
    line=${rest#*'}}'}
  done
  printf '%s\n' "${out}${line}"
done < "${template}"
