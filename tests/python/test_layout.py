"""parm.init's pipeline stages and group order (pp=, order=: the CLI's --pp and --order) and
what parm.layout() reports of them.

Run under mpirun at any world size (CTest: 1, 2 and 4 ranks). Needs no torch. Exits
non-zero when a check fails.
"""
import sys

import parm

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"rank {parm.rank()}: FAIL {what}", flush=True)


def raises(exc, fn, what, needle):
    try:
        fn()
    except exc as e:
        check(needle in str(e), f"{what}: message {str(e)!r} lacks {needle!r}")
        return
    except Exception as e:  # noqa: BLE001 - any other type is a failure too
        check(False, f"{what}: raised {type(e).__name__} ({e}), not {exc.__name__}")
        return
    check(False, f"{what}: accepted")


def main():
    parm.init()
    world, me = parm.world_size(), parm.rank()
    lay = parm.layout()
    check(lay.get("pp") == 1, f"default pp: {lay}")
    check(lay.get("order") == "mp-esp-ep-dp-pp", f"default order: {lay}")
    check(lay["dp"] == world, f"default dp: {lay}")

    if world % 2 == 0:
        # Two stages, pp outermost (the default order): stage s holds ranks
        # [s W/2, (s + 1) W/2); my pp group is my position in each.
        half = world // 2
        parm.init(pp=2)
        lay = parm.layout()
        check(lay.get("pp") == 2 and lay["dp"] == half and lay["edp"] == half,
              f"pp=2 on {world} ranks: {lay}")
        check(parm.group_ranks("pp") == [me % half, me % half + half],
              f"pp=2: pp group {parm.group_ranks('pp')}")
        check(parm.group_ranks("dp") == [r for r in range(world) if r // half == me // half],
              f"pp=2: dp group {parm.group_ranks('dp')}")

        # MP outermost: the MP group strides over the world instead of being consecutive.
        parm.init(mp=2, order="dp-ep-esp-mp-pp")
        lay = parm.layout()
        check(lay.get("order", "").startswith("dp-") and lay.get("order", "").find("mp") > 0,
              f"order dp-ep-esp-mp-pp: {lay}")
        check(parm.group_ranks("mp") == [me % half, me % half + half],
              f"mp=2 outermost: mp group {parm.group_ranks('mp')}")
        parm.init(mp=2)
        check(parm.group_ranks("mp") == [me // 2 * 2, me // 2 * 2 + 1],
              f"mp=2 innermost: mp group {parm.group_ranks('mp')}")

    raises(ValueError, lambda: parm.init(order="tp-dp"), "order with an unknown name",
           "unknown name 'tp'")
    raises(ValueError, lambda: parm.init(order=3), "order not a str", "order must be")
    raises(ValueError, lambda: parm.init(pp=1.5), "pp not an int", "pp must be an int")
    raises(ValueError, lambda: parm.init(pp=world + 1), "pp not dividing the world",
           f"--pp {world + 1}")

    ok = not failures
    if me == 0:
        print(f"test_layout: world {world}: {'passed' if ok else f'{len(failures)} failures'}",
              flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
