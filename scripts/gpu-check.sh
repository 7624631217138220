#!/usr/bin/env bash
# Everything GPU-related hvd can measure, in one command on a GPU machine (docs/gpu.md).
#
#   scripts/gpu-check.sh bundle [DIR]   here (Debian, no GPU needed): build, then install hvd into
#                                       DIR (default .gpu-bundle) with the libraries of this
#                                       machine that a GPU machine lacks, and list what it holds
#   scripts/gpu-check.sh run [DIR]      there: run every GPU check on the bundle and print one
#                                       table (the NCCL it loads is the nvidia-nccl wheel's when
#                                       the machine has one, else the one beside CUDA)
#
# With the device tool of this workplace: bundle here, then run there with DIR carried
# (docs/gpu.md shows the call). The bundle is stripped and stays within the 64 MiB a call carries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
dir=${2:-$root/.gpu-bundle}
limit_mib=60

bundle() {
  cmake -S "$root" -B "$root/build" -G Ninja >/dev/null
  cmake --build "$root/build" >/dev/null
  case "$(realpath -m "$dir")" in
    / | "$root" | "$HOME") echo "gpu-check: will not replace $dir" >&2; exit 2 ;;
  esac
  rm -rf "$dir"
  cmake --install "$root/build" --prefix "$dir" --strip >/dev/null
  # What a GPU machine needs of the plugins here: nccl (CUDA memory) and gloo (host memory,
  # staging). mpi and ofi need launchers and providers it does not have.
  rm -f "$dir"/lib/hvd/libhvd-backend-{mpi,ofi}.so
  rm -rf "$dir/include" "$dir/share" "$dir/lib/cmake" "$dir/lib/pkgconfig"
  # The shared libraries they load that are not the C and C++ runtime (which the GPU machine
  # has, newer): Gloo, Open MPI (hvd-bench's direct baseline), and theirs.
  mkdir -p "$dir/lib/deps"
  local base='^(linux-vdso|ld-linux|libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libnccl|libcuda|libcudart)\.'
  for program in "$dir"/bin/* "$dir"/libexec/hvd/* "$dir"/lib/hvd/*.so "$dir"/lib/libhvd.so.*; do
    [[ $(head -c 4 "$program" | tail -c 3) == ELF ]] || continue
    { ldd "$program" || true; } | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
      [[ $name =~ $base ]] && continue
      [[ -e $dir/lib/$name || -e $dir/lib/deps/$name ]] && continue
      cp -L "$path" "$dir/lib/deps/$name"
      strip --strip-unneeded "$dir/lib/deps/$name" 2>/dev/null || true
    done
  done
  # For hvd-mnist, built there against that machine's PyTorch (LibTorch with CUDA; Debian's is
  # CPU-only): the README job's digits (scripts/make-mnist.sh) and zlib's headers.
  if [ -d "$root/build/data/mnist-digits" ] && [ -e /usr/include/zlib.h ]; then
    mkdir -p "$dir/train/include"
    cp -r "$root/build/data/mnist-digits" "$dir/train/"
    cp /usr/include/zlib.h /usr/include/zconf.h "$dir/train/include/"
  else
    echo "gpu-check bundle: no MNIST digits (scripts/make-mnist.sh) or zlib.h: hvd-mnist will not run there"
  fi
  local size_kib
  size_kib=$(du -sk "$dir" | cut -f1)
  echo "gpu-check bundle: $dir, $((size_kib / 1024)) MiB (limit $limit_mib MiB)"
  (cd "$dir" && find . -type f | sort | sed 's/^\.\//  /')
  if ((size_kib > limit_mib * 1024)); then
    echo "gpu-check: the bundle is over $limit_mib MiB" >&2
    exit 1
  fi
}

# One row of the table: what was checked, and what came of it (with the note of a step that was
# cut short). Rows also go to $out/rows.txt as they come, so a run killed from outside keeps them.
rows=()
cut_short=""
rows_file=/dev/null
row() {
  rows+=("$(printf '%-46s %s' "$1" "$2${cut_short:+ ($cut_short)}")")
  printf '%s\n' "${rows[-1]}" >> "$rows_file"
  cut_short=""
}

run() {
  [ -x "$dir/bin/hvdrun" ] || { echo "gpu-check: no bundle in $dir (run: $0 bundle)" >&2; exit 2; }
  dir=$(cd "$dir" && pwd)
  local nccl_dir
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
             2>/dev/null || true)
  export LD_LIBRARY_PATH="$dir/lib/deps${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$dir/bin:$PATH" NCCL_SOCKET_IFNAME=lo HVD_TIMEOUT=${HVD_TIMEOUT:-60}
  unset HVD_PLUGIN_PATH HVD_BACKEND
  local out="${OUT:-$(mktemp -d)}"
  rows_file="$out/rows.txt"
  : > "$rows_file"
  # Each step is bounded, and all of them by HVD_GPU_CHECK_SECONDS (default 540, within the
  # device tool's 600 s a call): device time is lent by the minute. A step cut short says so in
  # its row.
  local deadline=$((SECONDS + ${HVD_GPU_CHECK_SECONDS:-540}))
  bounded() {
    local limit=$1 rc=0
    shift
    ((limit > deadline - SECONDS)) && limit=$((deadline - SECONDS))
    if ((limit <= 0)); then
      cut_short="not run: out of time"
      return 124
    fi
    echo "gpu-check: $(date +%T) $* (limit ${limit} s)" >&3
    timeout --kill-after=5 "$limit" "$@" || rc=$?
    if ((rc == 124 || rc == 137)); then
      cut_short="killed after ${limit} s"
      echo "gpu-check: $cut_short: $*" >&3
    fi
    return $rc
  }
  exec 3>&2

  if command -v nvidia-smi >/dev/null; then
    row "GPU" "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  else
    row "GPU" "none (no nvidia-smi)"
  fi
  local loaded=""
  if [ -e "$dir/lib/hvd/libhvd-backend-nccl.so" ]; then
    loaded=$(ldd "$dir/lib/hvd/libhvd-backend-nccl.so" 2>/dev/null | awk '/libnccl/ {print $3}' || true)
  fi
  local wheel=""
  [[ -n $nccl_dir ]] && wheel=" (the nvidia-nccl wheel: $nccl_dir)"
  row "NCCL loaded from" "${loaded:-not found}$wheel"
  hvd-info > "$out/hvd-info.txt" 2>&1 || true
  local nccl_line
  nccl_line=$(grep -A1 '^  nccl ' "$out/hvd-info.txt" | tr -s ' ' | tr '\n' ' ' || true)
  if [[ -z $nccl_line ]]; then
    row "hvd-info: nccl" "not listed (hvd-info.txt)"
  elif [[ $nccl_line == *"no usable GPU"* ]]; then
    row "hvd-info: nccl" "loads; (no usable GPU${nccl_line##*(no usable GPU}"
  else
    row "hvd-info: nccl" "loads, and sees a usable GPU"
  fi

  # The nccl plugin at world size 1 (one GPU holds one rank of a communicator). The suite's
  # buffers are host memory, which hvd stages through the GPU for a backend that takes CUDA
  # memory only; its CudaMemory cases hand the plugin device buffers directly.
  if [ -e "$dir/lib/hvd/libhvd-backend-nccl.so" ]; then
    bounded 240 hvd-plugin-check "$dir/lib/hvd/libhvd-backend-nccl.so" -np 1 \
      > "$out/nccl-plugin-check.txt" 2>&1 || true
    row "hvd-plugin-check nccl, 1 rank" "$(grep -c '^  pass  static\.' "$out/nccl-plugin-check.txt" || true) of 4 static rules pass; suite: $(grep -E '^[0-9]+ cases:' "$out/nccl-plugin-check.txt" || echo 'no summary') (nccl-plugin-check.txt)"
  else
    row "hvd-plugin-check nccl, 1 rank" "the nccl plugin was not built (no CUDA toolkit or NCCL where the bundle was made)"
  fi

  # CUDA tensors staged through host memory for gloo, 2 ranks sharing the GPU.
  local staged="FAIL"
  bounded 90 hvdrun -np 2 --backend gloo -- "$dir/libexec/hvd/hvd-conformance" --gtest_brief=1 \
    --gtest_filter='CudaMemory.*:*ZSchedulerLast.Cuda*' > "$out/gloo-staged.txt" 2>&1 && staged="pass"
  # DeviceBuffersOnAStream... stages on gloo; its sibling skips wherever a GPU is.
  if grep -q "no CUDA device here: " "$out/gloo-staged.txt"; then
    staged="$staged, but skipped: $(grep -m1 -o 'no CUDA device here: .*' "$out/gloo-staged.txt")"
  fi
  row "staged CUDA tensors through gloo, 2 ranks" "$staged"

  # hvd-bench on CUDA memory, ncclAllReduce called directly beside it (hvd/dir columns). Its
  # books (host names, timings) are host memory, staged through the GPU like the suite's.
  bounded 90 hvdrun -np 1 --backend nccl hvd-bench --mem cuda --baseline -b 1M -e 64M -f 4 -w 5 -n 20 \
    > "$out/bench-nccl.txt" 2>&1 || true
  row "hvd-bench nccl --mem cuda --baseline, 1 rank" "$(grep -c '^\[0\]<stdout>: *[0-9]' "$out/bench-nccl.txt" || true) rows (bench-nccl.txt)"
  # hvd's own device code against the CUDA runtime: pinned staging, the device executor's
  # batched copy-and-scale on 1024 tensors, its host time per tensor.
  local gpu_bench="not built (no CUDA compiler where the bundle was made)"
  if [ -x "$dir/libexec/hvd/hvd-gpu-bench" ]; then
    local rc=0
    bounded 90 "$dir/libexec/hvd/hvd-gpu-bench" > "$out/gpu-bench.txt" 2>&1 || rc=$?
    case $rc in
      0) gpu_bench="measured (below; gpu-bench.txt)" ;;
      77) gpu_bench="skipped: $(grep -m1 -o 'no usable GPU: .*' "$out/gpu-bench.txt")" ;;
      *) gpu_bench="FAIL, rc $rc (gpu-bench.txt)" ;;
    esac
  fi
  row "hvd-gpu-bench (staging, device executor)" "$gpu_bench"
  train "$out"
  python_train "$out"

  echo "gpu-check: results (full outputs in $out)"
  printf '  %s\n' "${rows[@]}"
  echo
  grep -E '^\[0\]<stdout>: +[0-9]' "$out/bench-nccl.txt" | sed 's/^\[0\]<stdout>:/  nccl /' || true
  [[ $gpu_bench == measured* ]] && sed 's/^/  /' "$out/gpu-bench.txt"
  return 0
}

# hvd-mnist on the GPU: built against the machine's PyTorch (its LibTorch has CUDA), then the
# README's job (2 ranks, --min-accuracy 0.96) with CUDA gradients, on nccl at 1 rank (the device
# executor on LibTorch's stream) and on gloo at 2 ranks sharing the GPU (staged through host
# memory), beside the same job on the CPU.
# Whether a GPU training row cannot run here: then the row says why (true), else nothing (false).
training_skipped() {
  local why=""
  if [ ! -d "$dir/train/mnist-digits" ]; then
    why="no MNIST digits in the bundle"
  elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    why="no PyTorch with a usable GPU (python3 -c 'import torch')"
  elif ! command -v g++ >/dev/null; then
    why="no g++"
  fi
  [[ -n $why ]] || return 1
  row "$1" "skipped: $why"
}

train() {
  local out=$1
  training_skipped "hvd-mnist on the GPU" && return 0
  local build
  build=$(mktemp -d)
  build_and_train "$out" "$build"
  rm -rf "$build"
}

build_and_train() {
  local out=$1 build=$2 flags
  # torch.utils.cpp_extension knows LibTorch's include and library directories and its ABI.
  if ! flags=$(timeout 120 python3 - <<'PY'
import torch
from torch.utils import cpp_extension as ext
try:
    inc, lib = ext.include_paths(device_type="cuda"), ext.library_paths(device_type="cuda")
except TypeError:
    inc, lib = ext.include_paths(cuda=True), ext.library_paths(cuda=True)
print(" ".join(["-I" + p for p in inc] + ["-L" + p + " -Wl,-rpath," + p for p in lib] +
               ["-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]))
PY
  ); then
    row "hvd-mnist on the GPU" "skipped: torch.utils.cpp_extension gave no build flags"
    return 0
  fi
  local cxx="g++ -std=c++20 -O2 -DHVD_TRAIN_WITH_CUDA -I$root/train/include -I$root/core/include"
  cxx+=" -I$root/sdk/include -I$dir/train/include $flags"
  local rc=0
  echo "gpu-check: $(date +%T) building hvd-mnist against PyTorch $(python3 -c 'import torch; print(torch.__version__)')" >&3
  local source pids=()
  for source in src/train.cpp mnist/main.cpp mnist/mnist_data.cpp; do
    bounded 300 $cxx -fPIC -c "$root/train/$source" -o "$build/$(basename "$source" .cpp).o" \
      >> "$out/hvd-mnist-build.txt" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  if ((rc == 0)); then
    bounded 120 $cxx "$build"/*.o -o "$build/hvd-mnist" "$dir/lib/libhvd.so.0" \
      -Wl,-rpath,"$dir/lib" -Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed -ltorch \
      -ltorch_cpu -lc10 -l:libz.so.1 >> "$out/hvd-mnist-build.txt" 2>&1 || rc=$?
  fi
  if ((rc != 0)); then
    row "hvd-mnist on the GPU" "FAIL: the build failed (hvd-mnist-build.txt)"
    return 0
  fi
  local job
  for job in "nccl 1 cuda" "gloo 2 cuda" "gloo 2 cpu"; do
    set -- $job
    local log="$out/hvd-mnist.txt" result
    echo "== hvdrun -np $2 --backend $1 hvd-mnist --device $3" >> "$log"
    if bounded 120 hvdrun -np "$2" --backend "$1" -- "$build/hvd-mnist" --device "$3" \
         --data-dir "$dir/train/mnist-digits" --min-accuracy 0.96 >> "$log" 2>&1; then
      result="pass: $(grep -o 'trained .*' "$log" | tail -1 || true)"
    else
      result="FAIL (hvd-mnist.txt)"
    fi
    row "hvd-mnist $1, $2 rank(s), --device $3" "$result"
  done
}

# hvd.torch on the GPU: its extension built against the machine's PyTorch (pybind11 from torch's
# headers), then examples/python/mnist.py with CUDA tensors on nccl at 1 rank and on gloo at 2
# ranks sharing the GPU, as hvd-mnist above.
python_train() {
  local out=$1
  training_skipped "hvd.torch on the GPU" && return 0
  local package flags rc=0
  package=$(mktemp -d)
  cp -r "$root/python/hvd" "$package/"
  printf 'VERSION = "gpu-check"\nBACKENDS = ("gloo", "nccl")\nCUDA = True\nNCCL_VERSION = 1\n' > "$package/hvd/build_info.py"
  if ! flags=$(timeout 120 python3 - <<'PY'
import sysconfig, torch
from torch.utils import cpp_extension as ext
inc, lib = ext.include_paths(), ext.library_paths()
print(" ".join(["-I" + p for p in inc + [sysconfig.get_paths()["include"]]] +
               ["-L" + p + " -Wl,-rpath," + p for p in lib] +
               ["-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI),
                "-o", "hvd/torch/_ops" + sysconfig.get_config_var("EXT_SUFFIX")]))
PY
  ); then
    row "hvd.torch on the GPU" "skipped: torch.utils.cpp_extension gave no build flags"
    return 0
  fi
  echo "gpu-check: $(date +%T) building hvd.torch against PyTorch $(python3 -c 'import torch; print(torch.__version__)')" >&3
  (cd "$package" && bounded 300 g++ -std=c++17 -O2 -shared -fPIC -fvisibility=hidden \
     -DTORCH_EXTENSION_NAME=_ops -DTORCH_API_INCLUDE_EXTENSION_H -I"$root/core/include" \
     -I"$root/sdk/include" "$root/python/src/torch_ops.cpp" $flags "$dir/lib/libhvd.so.0" \
     -Wl,-rpath,"$dir/lib" -ltorch_python -ltorch -ltorch_cpu -lc10) \
    >> "$out/hvd-torch-build.txt" 2>&1 || rc=$?
  if ((rc != 0)); then
    row "hvd.torch on the GPU" "FAIL: the build failed (hvd-torch-build.txt)"
    return 0
  fi
  local job
  for job in "nccl 1" "gloo 2"; do
    set -- $job
    local log="$out/hvd-torch-mnist.txt" result
    echo "== hvdrun -np $2 --backend $1 python3 examples/python/mnist.py (CUDA)" >> "$log"
    if PYTHONPATH="$package" bounded 180 hvdrun -np "$2" --backend "$1" -- python3 \
         "$root/examples/python/mnist.py" --data-dir "$dir/train/mnist-digits" \
         --min-accuracy 0.96 >> "$log" 2>&1; then
      result="pass: $(grep -o 'trained .*' "$log" | tail -1 || true)"
    else
      result="FAIL (hvd-torch-mnist.txt)"
    fi
    row "hvd.torch mnist.py $1, $2 rank(s), CUDA" "$result"
  done
  rm -rf "$package"
}

case "$mode" in
  bundle) bundle ;;
  run) run ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
