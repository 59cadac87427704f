# Sourced by the loopback multi-machine test scripts: free_port prints a port
# nothing listens on, found without Python (testing accel needs none): random
# ones below the kernel's ephemeral range (32768 and up), each tried with a
# connect that must be refused.
free_port() {
  for _ in $(seq 64); do
    local p=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}
