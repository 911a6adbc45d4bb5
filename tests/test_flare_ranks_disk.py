#!/usr/bin/env python3
"""The host prefix cache of ranks in separate processes through `flare run`
on loopback (issue 17 part B; design 2.14; docs/multihost.md):

  - qwen-tp2-small as two processes, each rank with its own record
    directory (qualify/multihost_cache.py run()): a GPU-cache hit without a
    host hit, a host restore after evicting the GPU copies, a restore after
    restarting every rank, every answer equal to one process's, every
    rank's directory holding the same file names and lengths after each
    phase;
  - a peer restarted with another record set: the agreement deletes what
    one rank lacks, on every rank, and what is left still restores;
  - a disk store on rank 0 only: the startup of both fails, naming it."""
import os
import sys

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import FlareError, TempDir, install_cleanup  # noqa: E402
import multihost_cache as mc  # noqa: E402
from ranks import Ranks  # noqa: E402

install_cleanup()
flare = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")
core = os.path.join(src, "cores", "qwen-tp2-small.core")


def restart_with_another_set(tmp):
    """Rank 1 loses one record file and gains one nobody else has: after
    the restart's agreement every rank holds the same files -- the lost
    record and the stray gone from every rank -- and the prompt restores."""
    d0, d1 = (os.path.join(tmp, f"rank{r}") for r in (0, 1))
    before = mc.rank_files(d0)
    ns1 = [os.path.join(dp, f) for dp, _, fs in os.walk(d1) for f in fs if f.endswith(".ckpt")]
    ns1.sort()
    lost = os.path.basename(ns1[0])
    os.unlink(ns1[0])
    stray = os.path.join(os.path.dirname(ns1[1]), "00000000000000ff-" + "ab" * 16 + ".ckpt")
    with open(ns1[1], "rb") as fh, open(stray, "wb") as out:
        out.write(fh.read())
    args = ["--max-active", "1", "--prefix-cache-fetch", "always", "--prefix-cache-max-age", "off"]
    ra = {0: ["--prefix-cache-disk", d0], 1: ["--prefix-cache-disk", d1]}
    with Ranks(flare, core, 2, args=args, rank_args=ra) as g:
        after = mc.wait_same([d0, d1], "after the agreement")
        assert lost not in after, f"{lost} is missing on rank 1 but kept"
        assert os.path.basename(stray) not in after, "a record only rank 1 holds was kept"
        assert set(after) <= set(before) and len(after) < len(before), (sorted(before),
                                                                        sorted(after))
        text, fl = mc.ask(g.lead)
        print(f"a peer with another record set: {len(before)} records before, {len(after)} "
              f"agreed on every rank ({lost} lost on rank 1 and the stray dropped); the "
              f"prompt now restores {fl['reused_host_tokens']} tokens ({fl['source']})")


def disk_on_one_rank(tmp):
    g = Ranks(flare, core, 2, rank_args={0: ["--prefix-cache-disk", os.path.join(tmp, "only0")]},
              start_timeout=60)
    try:
        g.start()
        raise AssertionError("a disk store on rank 0 only started")
    except FlareError as e:
        assert "every rank must have a disk store or none" in str(e), str(e)
        print("a disk store on one rank only is refused:",
              [ln for ln in str(e).splitlines() if "or none" in ln][0])
    finally:
        g.kill_all()


with TempDir("flare-ranks-disk-") as tmp:
    print("qwen-tp2-small, two processes, a record directory each:")
    mc.run(flare, core, 2, tmp)
    restart_with_another_set(tmp)
    disk_on_one_rank(tmp)
print("ok")
