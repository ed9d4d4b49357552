# Source on the device machine, from the repository root, after the bundle parts
# are under /tmp/gpu-bundle: assembles the offline sglang 0.5.23 site, puts it on
# PYTHONPATH (after assemble.sh, which would otherwise reset it; FlashInfer's GDN
# kernels need nvidia_cutlass_dsl's packages), installs this tree into it and
# checks the imports a block needs. Then start a block:
#   . test/gpu/device_setup.sh && GRAPHFIX_COMMIT=<sha> RES=/tmp/res \
#     setsid nohup bash test/gpu/run_block.sh ... >/tmp/block.log 2>&1 </dev/null &
# GRAPHFIX_COMMIT: the commit as `git rev-parse --short HEAD` gives it on the
# development machine (the device's .git may be stale; provenance records both).
eval "$(bash /tmp/gpu-bundle/00/assemble.sh 2>/tmp/assemble.log)"
export PYTHONPATH=/tmp/sglang-site/nvidia_cutlass_dsl/dsl_packages:/tmp/sglang-site
python3 -m pip install -q --upgrade --no-deps --no-build-isolation --target /tmp/sglang-site . \
  >/tmp/install.log 2>&1
python3 -c "import cutlass, sglang, sglang_graphfix; print('device setup: sglang', sglang.__version__)" \
  || { tail -5 /tmp/assemble.log /tmp/install.log; false; }
