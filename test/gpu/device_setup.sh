# Source on the device machine, from the repository root, after the bundle parts
# are under /tmp/gpu-bundle (parts re-split by test/gpu/resplit_bundle.sh so that
# each call stays under the tool's 64 MiB): assembles the offline sglang 0.5.23 site, puts it on
# PYTHONPATH (after assemble.sh, which would otherwise reset it; FlashInfer's GDN
# kernels need nvidia_cutlass_dsl's packages), installs this tree into it and
# checks the imports a block needs; with /tmp/jitcache present (a previous
# session's caches: test/gpu/cache_out.sh, cache_pack.sh), unpacks them first.
# Then start a block (in braces, so that only the block goes to the background):
#   . test/gpu/device_setup.sh && { GRAPHFIX_COMMIT=<sha> RES=/tmp/res \
#     setsid nohup bash test/gpu/run_block.sh ... >/tmp/block.log 2>&1 </dev/null & }
# (without the braces the setup itself runs in the background and dies with
# the calling command). The machine goes back 30 s after a call ends, and tool
# calls run one after another: during a block make only polling calls, back to
# back: `RES=/tmp/res bash test/gpu/poll_block.sh 300` (progress, and what the
# block has written so far back through $OUT).
# Before the first device call, ask the tool's status: while it reports none_now
# or paused, a run only costs device time (15-90 s a refused start). Send the
# bundle's parts in a few messages of 6-13 calls, each sent as soon as the last
# answered (the first one tells whether a machine came; docs/next_gpu_blocks.md).
# GRAPHFIX_COMMIT: the commit as `git rev-parse --short HEAD` gives it on the
# development machine (the device's .git may be stale; provenance records both).
# Each device call is a new shell: a later call that runs Python sources this file
# again (the site and the caches are kept: assemble.sh skips a site it built, the
# caches unpack once, and the install reruns only for another tree, so a running
# block's new processes never meet a half-replaced package). Its status is the
# import check's.
if [ -d /tmp/jitcache ] && [ ! -e /tmp/jitcache/.unpacked ]; then
  bash test/gpu/cache_in.sh && touch /tmp/jitcache/.unpacked || echo "device setup: no caches"
fi
eval "$(bash /tmp/gpu-bundle/00/assemble.sh 2>/tmp/assemble.log)"
export PYTHONPATH=/tmp/sglang-site/nvidia_cutlass_dsl/dsl_packages:/tmp/sglang-site
tree=$(tar -c --sort=name --mtime=@0 --owner=0 --group=0 --exclude=__pycache__ --exclude='*.egg-info' python pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat /tmp/sglang-site/.graphfix-tree 2>/dev/null)" != "$tree" ]; then
  python3 -m pip install -q --upgrade --no-deps --no-build-isolation --target /tmp/sglang-site . \
    >/tmp/install.log 2>&1 && echo "$tree" >/tmp/sglang-site/.graphfix-tree
fi
setup_failed=
python3 -c "import cutlass, sglang, sglang_graphfix; print('device setup: sglang', sglang.__version__)" \
  || { tail -5 /tmp/assemble.log /tmp/install.log; setup_failed=1; }
# sglang.benchmark.serving (benchmark/serving_prefill_graph.py's client) needs
# datasets, an sglang requirement the shared bundle leaves out: build the bundle
# with datasets==5.2.0 among its extra requirements (its own needs are in the image).
python3 -c "import sglang.benchmark.serving" 2>/dev/null \
  || echo "device setup: sglang.benchmark.serving does not import; serving benchmarks will stop (bundle built without datasets==5.2.0?)"
[ -z "$setup_failed" ]
