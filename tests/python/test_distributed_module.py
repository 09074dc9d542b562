"""flow.distributed (OneFlow's names for the process's place in a job)."""
import os
import subprocess
import sys

import flowjit as flow


def test_a_process_alone():
    assert (flow.distributed.get_rank(), flow.distributed.get_world_size(),
            flow.distributed.get_local_rank(), flow.distributed.is_multi_client()) == (0, 1, 0, False)


def test_values_follow_the_environment_of_a_launched_process():
    env = dict(os.environ, FLOWJIT_WORLD_SIZE="3", FLOWJIT_RANK="2", FLOWJIT_LOCAL_RANK="1")
    out = subprocess.run([sys.executable, "-c", "import flowjit as f; d = f.distributed; "
                          "print(d.get_rank(), d.get_world_size(), d.get_local_rank(), d.is_multi_client())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "3", "1", "True"]
