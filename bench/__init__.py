"""functrain's benchmarks: `python -m bench <suite>` (see bench/README.md).

Benchmarks compare variants side by side in one process, interleaved and repeated, and report
medians and ratios; they are never timed assertions in tests.
"""

import os

# Read before anything imports torch's compiler, which fills in its default: a cache directory
# the user chose is kept, otherwise suites compile into a fresh one (see common.fresh_compile_cache).
USER_INDUCTOR_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
