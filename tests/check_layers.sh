#!/bin/sh
# The layering docs/architecture.md describes ("Layers", "Thread-local
# state"), checked on the sources with grep: a regression fails here.
# Usage: check_layers.sh SOURCE_DIR
set -eu
src="$1/src"
doc="$1/docs/architecture.md"
bad=0
fail() { echo "$1"; bad=1; }
# code lines only: drop the lines of block comments
code() { grep -vE '^[^:]*:[0-9]+:[[:space:]]*(/\*|\*)'; }

# 1. core includes nothing of another folder of src/ (the device interface is core's own)
out=$(grep -rn '#include "[a-z_]*/' "$src/core" | grep -v '"core/\|"accel/core.h"\|"accel/cpu.h"' || true)
[ -z "$out" ] || fail "src/core includes a header above it:
$out"

# 2. the backends include nothing of the layers that use them (the known knots into io
#    and tracking are listed in docs/architecture.md); dist only where the plug-in
#    contract carries the process-group interface (plugin.h, plugin.c)
out=$(grep -rnE '#include "(autograd|ops|nn|optim|data|tokenizer|accelerator|bigmodel|cli)/|#include "accel/(autograd|ops|nn|bert|optim|data|tokenizer|accelerator|bigmodel)\.h"' "$src/backends" || true)
[ -z "$out" ] || fail "src/backends includes a layer above it:
$out"
out=$(grep -rnE '#include "(dist/|accel/dist\.h")' "$src/backends" | grep -vE '^[^:]*/backends/plugin\.[ch]:' || true)
[ -z "$out" ] || fail "src/backends includes dist outside the plug-in contract (plugin.h, plugin.c):
$out"

# 2b. the knots untied stay untied: autograd below ops (ops record on the tape;
#     the autocast dtype is autograd's), tracking below io (CRC-32C and the atomic file writer are core's)
out=$(grep -rnE '#include "(ops/|accel/ops\.h")' "$src/autograd" || true)
[ -z "$out" ] || fail "src/autograd includes ops (the layer above it):
$out"
out=$(grep -rnE '#include "(io/|accel/io\.h")' "$src/tracking" || true)
[ -z "$out" ] || fail "src/tracking includes io (the layer above it):
$out"

# 2c. a prepared model (accel__model) holds no strategy's state: DDP's shared
#     gradient memory is struct accel__ddp's (ddp.c), ZeRO's accel__zero_model's
out=$(grep -HnwE 'orig_grads|grad_stage' "$src/accelerator/accelerator_internal.h" | code || true)
[ -z "$out" ] || fail "accel__model holds a strategy's state (keep it in the strategy's own struct):
$out"

# 3. no model family named in generic code: the family table (src/nn/family.h) answers
out=$(grep -rnE 'accel_+(bert|llama|decoder)_|"[A-Za-z0-9]*(DecoderLayer|ForCausalLM|BertLayer|Block)"' \
      "$src/core" "$src/autograd" "$src/ops" "$src/optim" "$src/data" "$src/dist" "$src/accelerator" \
      "$src/nn/module.c" "$src/nn/module_memory.c" | code || true)
[ -z "$out" ] || fail "generic code names a model family:
$out"

# 4. src/dist allocates through the library's allocator
out=$(grep -rnE '(^|[^_a-zA-Z0-9.>])(malloc|calloc|realloc|strdup|free)\(' "$src/dist" | code || true)
[ -z "$out" ] || fail "src/dist allocates outside accel_malloc & co:
$out"

# 5. every thread-local variable is in the table of docs/architecture.md
names=$(grep -rn -A4 '_Thread_local' "$src" | awk '
    /_Thread_local/ && !/^[^:]*:[0-9]+:[[:space:]]*(\/\*|\*)/ {
        line = $0; sub(/.*_Thread_local[[:space:]]+/, "", line)
        if (line ~ /\{[^}]*$/) { instruct = 1; next }   # a struct: its name follows the "}"
        sub(/=.*/, "", line); gsub(/\[[^]]*\]/, "", line); sub(/;.*/, "", line)
        n = split(line, part, ",")
        for (i = 1; i <= n; i++) {
            gsub(/^[[:space:]]+|[[:space:]]+$/, "", part[i])
            k = split(part[i], w, /[[:space:]*]+/); print w[k]
        }
        next
    }
    instruct && /}[[:space:]]*[A-Za-z_][A-Za-z0-9_]*;/ {
        line = $0; sub(/.*}[[:space:]]*/, "", line); sub(/;.*/, "", line); print line; instruct = 0
    }')
[ -n "$names" ] || fail "no _Thread_local variable found (the parse is broken)"
table=$(sed -n '/^## Thread-local state/,/^## /p' "$doc")
for v in $names; do
    printf '%s\n' "$table" | grep -q "\`$v\`\|[ ,]$v[,\` ]" || fail "_Thread_local $v is not in docs/architecture.md's table"
done

[ "$bad" = 0 ] && echo "layers hold: core includes no layer above it, the backends none of their users (dist only in the plug-in contract), autograd not ops, tracking not io, accel__model no strategy state, no model named in generic code, dist allocates through accel_malloc, $(echo $names | wc -w) thread-locals all documented"
exit "$bad"
