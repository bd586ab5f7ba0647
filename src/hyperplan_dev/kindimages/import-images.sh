# Run inside a plain container of the node image during its build: start containerd, import the
# images saved in /kind/images.tar into the k8s.io namespace without unpacking, stop containerd.
set -eu
nohup containerd > /tmp/containerd-import.log 2>&1 &
for _ in $(seq 1 120); do
  if [ -S /run/containerd/containerd.sock ] && ctr version > /dev/null 2>&1; then break; fi
  sleep 0.5
done
ctr -n k8s.io images import --no-unpack --all-platforms /kind/images.tar
ctr -n k8s.io images ls -q
pkill -x containerd
for _ in $(seq 1 100); do pgrep -x containerd > /dev/null || break; sleep 0.2; done
rm -f /kind/images.tar /tmp/containerd-import.log
