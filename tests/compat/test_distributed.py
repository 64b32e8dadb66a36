"""fairseq's distributed entry point, as the plugin patches it: a worker takes its process group down before it
returns (a gloo group left to the interpreter's teardown aborted a worker now and then on a loaded machine)."""
import socket

import torch.distributed as dist
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils

from fairseq_linattn.compat import distributed


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_worker_destroys_its_process_group_before_it_returns(tmp_path):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(tmp_path), "--cpu", "--arch", "transformer_lm", "--task",
                                                "language_modeling", "--distributed-backend", "gloo",
                                                "--distributed-world-size", "1", "--distributed-init-method",
                                                f"tcp://127.0.0.1:{free_port()}"])
    cfg = convert_namespace_to_omegaconf(args)
    seen = {}

    def main(cfg):
        seen["initialized"] = dist.is_initialized()
        seen["rank"] = dist.get_rank()

    assert distributed_utils.distributed_main is distributed.distributed_main_dying_with_parent  # patched
    distributed_utils.distributed_main(0, main, cfg, {})
    assert seen == {"initialized": True, "rank": 0}
    assert not dist.is_initialized()
