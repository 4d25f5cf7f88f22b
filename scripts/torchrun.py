#!/usr/bin/python3
# torchrun, for Debian's python3-torch 1.13 on Python 3.11: the same torch.distributed.run.main()
# with one parser replaced.
#
# Why: torch 1.13's Std.from_str (torch/distributed/elastic/multiprocessing/api.py) maps "0".."3"
# to Std members by iterating the IntFlag, and since Python 3.11 iteration yields only the
# single-bit members (OUT, ERR), so "0" (NONE, the default of --redirects and --tee) becomes None
# and torchrun fails before it starts any worker ("'NoneType' object has no attribute 'get'").
# Std(int(v)) is what the loop meant. Where torchrun works as shipped, this changes nothing.
#
#   /usr/bin/python3 scripts/torchrun.py --nproc_per_node 2 --no_python build/bin/dgc train ...
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402  (after the fix, as torchrun would import)

if __name__ == "__main__":
    sys.exit(main())
