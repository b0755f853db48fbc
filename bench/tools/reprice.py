#!/usr/bin/python3
"""Offline re-pricing of a measured sweep: every configuration of a `bench-layer --sweep`
JSON priced again with `parm plan` under a profile (balanced router, as `parm plan` prices),
then the issue's targets computed from the sweep's measured times. The measurements never
feed the profile: the sweep only judges it.

  bench/tools/reprice.py --sweep S.json --profile P.json [--profile Q.json ...]
                         [--devices-per-node D] [--parm build/parm] [--wrong] [--json OUT]
                         [--eager-limit-bytes E --eager-gain G] [--eager-gain-mixed G2]
                         [--compute-scale S] [--rendezvous-per-compute R] [--handshake-us H]

--eager-limit-bytes / --eager-gain / --eager-gain-mixed / --compute-scale /
--rendezvous-per-compute (step_sync.per_compute and step_sync_world.per_compute) / --handshake-us
(every inter-node op's handshake above the eager limit) set those terms
(docs/perfmodel.md) in a copy of each profile, marked "assumed (reprice.py)": for profiles taken
before they existed. --eager-gain alone sets both shares (the pure and the mixed span).

Per profile it prints: selection (plain: auto is the measured fastest; distinct: auto runs
the measured fastest's program), auto / fastest (median, worst), the median |predicted -
measured| / measured over every (configuration, schedule), and auto over the baseline (min,
median, max, share > 1.13x). --wrong lists the configurations chosen wrong (distinct). --ratios
prints the median measured / predicted per (T, schedule), and of the compute steps and the rest
where the sweep measured them (`parm plan`'s compute_ms against measured_compute_ms).
"""
import argparse, concurrent.futures as cf, json, os, statistics as st, subprocess, tempfile


def with_terms(profile, a):
    """profile, or a temporary copy with the terms given on the command line set."""
    if (a.eager_gain is None and a.eager_limit_bytes is None and a.compute_scale is None and
            a.eager_gain_mixed is None and a.rendezvous_per_compute is None and
            a.handshake_us is None):
        return profile
    p = json.load(open(profile))
    why = 'assumed (reprice.py)'
    if a.eager_gain is not None or a.eager_limit_bytes is not None:
        if a.eager_gain is None or a.eager_limit_bytes is None:
            raise SystemExit('reprice.py: --eager-gain and --eager-limit-bytes go together')
        p['fused'].update(eager_gain=a.eager_gain, eager_gain_source=why,
                          eager_gain_mixed=a.eager_gain, eager_gain_mixed_source=why,
                          eager_limit_bytes=a.eager_limit_bytes, eager_limit_source=why)
    if a.eager_gain_mixed is not None:
        p['fused'].setdefault('eager_gain', p['fused'].get('eager_gain', 0.0))
        p['fused'].setdefault('eager_gain_source', why)
        p['fused'].update(eager_gain_mixed=a.eager_gain_mixed, eager_gain_mixed_source=why)
    if a.compute_scale is not None:
        p['layer_compute'] = {'scale': a.compute_scale, 'source': why}
    if a.rendezvous_per_compute is not None:
        for key in ('step_sync', 'step_sync_world'):
            sync = dict(p.get(key) or p['step_sync'])
            sync.update(per_compute=a.rendezvous_per_compute, source=why)
            p[key] = sync
    if a.handshake_us is not None:
        for op in p['collectives']['inter'].values():
            op.update(handshake_us=a.handshake_us, handshake_source=why)
    fd, out = tempfile.mkstemp(suffix='.json')
    with os.fdopen(fd, 'w') as f:
        json.dump(p, f)
    return out


def plan(parm, profile, c, dpn, world, chunks):
    fd, out = tempfile.mkstemp(suffix='.json')
    os.close(fd)
    try:
        subprocess.run([parm, 'plan', '--profile', profile, '--tokens', str(c['T']),
                        '--model-dim', str(c['M']), '--hidden', str(c['H']), '--experts', str(c['E']),
                        '--topk', str(c['k']), '--capacity-factor', str(c['f']),
                        '--mp', str(c['N_MP']), '--esp', str(c['N_ESP']), '--ep', str(c['N_EP']),
                        '--devices-per-node', str(dpn), '--world', str(world),
                        '--schedule', 'all', '--fuse', 'both', '--chunks', str(chunks),
                        '--json', out], check=True, capture_output=True)
        return {x['schedule']: (x['total_ms'], x['fwd_ms'], x['bwd_ms'], x['compute_ms'])
                for x in json.load(open(out))['candidates']}
    finally:
        os.unlink(out)


def ratios(sweep, prices):
    """Median measured / predicted, forward and backward, per (T, schedule); and of the compute
    steps and the rest where the sweep measured them (measured_compute_ms, measured_rest_ms)."""
    by = {}
    for c, pl in zip(sweep['configs'], prices):
        for x in c['candidates']:
            if x['schedule'] not in pl:
                continue
            _, f, b, comp = pl[x['schedule']]
            split = ((x['measured_compute_ms'] / comp, x['measured_rest_ms'] / (f + b - comp))
                     if 'measured_compute_ms' in x else None)
            by.setdefault((c['T'], x['schedule']), []).append(
                (x['measured_fwd_ms'] / f, x['measured_bwd_ms'] / b, x['measured_ms'] / (f + b),
                 split))
    for key in sorted(by):
        v = by[key]
        splits = [s for *_, s in v if s is not None]
        print('  T=%-5d %-9s measured/predicted: fwd %.2f bwd %.2f total %.2f%s  [%d]' % (
            key[0], key[1], st.median(a[0] for a in v), st.median(a[1] for a in v),
            st.median(a[2] for a in v),
            '; compute %.2f rest %.2f' % (st.median(s[0] for s in splits),
                                         st.median(s[1] for s in splits)) if splits else '',
            len(v)))


def view(rows):
    """The policy view (src/perfmodel/sweep_policies.h) of rows (measured ms by schedule, auto's
    choice): auto's total over the per-configuration fastest's, and per fixed rule "always X"
    (its total, auto's total, configurations) over those where X exists."""
    auto_total = fastest_total = 0.0
    fixed = {}
    for cand, auto in rows:
        auto_total += cand[auto]
        fastest_total += min(cand.values())
        for n, t in cand.items():
            f = fixed.setdefault(n, [0.0, 0.0, 0])
            f[0] += t
            f[1] += cand[auto]
            f[2] += 1
    return auto_total, fastest_total, fixed


def policies(sweep, prices):
    """The policy view under these prices, and by halves of the rounds where the sweep kept
    them (measured_{even,odd}_rounds_ms): the fastest by one half timed by the other, and each
    fixed rule's verdict in both halves."""
    autos = [min((n for n in pl if n in {x['schedule'] for x in c['candidates']}),
                 key=lambda n: pl[n]) for c, pl in zip(sweep['configs'], prices)]
    def measured(key):
        return [{x['schedule']: x[key] for x in c['candidates']} for c in sweep['configs']]
    auto_total, fastest_total, fixed = view(zip(measured('measured_ms'), autos))
    out = {'auto_over_fastest': auto_total / fastest_total,
           'fixed': {n: {'over_auto': f[0] / f[1], 'configs': f[2]} for n, f in fixed.items()}}
    if all('measured_even_rounds_ms' in x for c in sweep['configs'] for x in c['candidates']):
        half = [measured('measured_%s_rounds_ms' % h) for h in ('even', 'odd')]
        cross = sum(half[1 - i][j][min(half[i][j], key=half[i][j].get)]
                    for i in (0, 1) for j in range(len(autos)))
        sides = [view(zip(half[i], autos)) for i in (0, 1)]
        out['auto_over_cross_fastest'] = (sides[0][0] + sides[1][0]) / cross
        beats = [{n: f[0] < f[1] for n, f in side[2].items()} for side in sides]
        out['verdicts'] = {n: 'halves disagree' if beats[0][n] != beats[1][n] else
                           'beats auto' if beats[0][n] else 'does not beat auto'
                           for n in beats[0]}
    return out


def error_by_schedule(sweep, prices):
    by = {}
    for c, pl in zip(sweep['configs'], prices):
        for x in c['candidates']:
            if x['schedule'] in pl:
                by.setdefault(x['schedule'], []).append(
                    abs(pl[x['schedule']] - x['measured_ms']) / x['measured_ms'])
    return {n: st.median(v) for n, v in by.items()}


def judge(sweep, prices):
    prices = [{n: t[0] for n, t in pl.items()} for pl in prices]
    right = right_plain = 0
    errs, regrets, speedups, wrong = [], [], [], []
    for c, pl in zip(sweep['configs'], prices):
        cand = {x['schedule']: x for x in c['candidates']}
        names = [n for n in pl if n in cand]
        auto = min(names, key=lambda n: pl[n])  # first on ties, as `choose`
        fastest = c['fastest']
        prog = lambda n: cand[n].get('same_program_as', n)
        ok = prog(auto) == prog(fastest)
        right += ok
        right_plain += auto == fastest
        regrets.append(cand[auto]['measured_ms'] / cand[fastest]['measured_ms'])
        if 'baseline' in cand:
            speedups.append(cand['baseline']['measured_ms'] / cand[auto]['measured_ms'])
        errs += [abs(pl[n] - cand[n]['measured_ms']) / cand[n]['measured_ms'] for n in names]
        if not ok:
            wrong.append({'id': c['id'], 'T': c['T'], 'M': c['M'], 'H': c['H'], 'k': c['k'],
                          'N_ESP': c['N_ESP'], 'N_EP': c['N_EP'], 'auto': auto,
                          'fastest': fastest,
                          'predicted_auto_over_fastest': pl[auto] / pl[fastest],
                          'measured_auto_over_fastest': regrets[-1]})
    n = len(sweep['configs'])
    return {'policies': policies(sweep, prices), 'error_by_schedule': error_by_schedule(sweep, prices),
            'selection_accuracy': right_plain / n, 'selection_accuracy_distinct': right / n,
            'auto_over_fastest': {'median': st.median(regrets), 'worst': max(regrets)},
            'median_abs_relative_error': st.median(errs),
            'speedup_auto_over_baseline': {
                'min': min(speedups), 'median': st.median(speedups), 'max': max(speedups),
                'share_above_1_13': sum(s > 1.13 for s in speedups) / len(speedups)}
            if speedups else None,
            'wrong_choices': wrong}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--sweep', required=True)
    ap.add_argument('--profile', action='append', required=True)
    ap.add_argument('--devices-per-node', type=int, default=0,
                    help='ranks per node of the sweep (default: its ranks_per_node, else the '
                         'profile\'s machine.ranks / nodes: the cluster it was taken on)')
    ap.add_argument('--parm', default=os.path.join(os.path.dirname(__file__), '../../build/parm'))
    ap.add_argument('--wrong', action='store_true')
    ap.add_argument('--ratios', action='store_true',
                    help='median measured / predicted per (T, schedule), forward and backward')
    ap.add_argument('--json')
    ap.add_argument('--eager-limit-bytes', type=float)
    ap.add_argument('--eager-gain', type=float)
    ap.add_argument('--eager-gain-mixed', type=float,
                    help='the share where the group has peers on a rank\'s own node too')
    ap.add_argument('--compute-scale', type=float)
    ap.add_argument('--rendezvous-per-compute', type=float,
                    help='the rendezvous per us of compute before a collective step (model.h)')
    ap.add_argument('--handshake-us', type=float,
                    help='every inter-node op\'s handshake above the eager limit (model.h)')
    a = ap.parse_args()
    sweep = json.load(open(a.sweep))
    world = sweep.get('world', 4)
    chunks = sweep.get('chunks', 4)
    results = {}
    for prof in a.profile:
        dpn = a.devices_per_node or sweep.get('ranks_per_node', 0)
        if not dpn:
            m = json.load(open(prof))['machine']
            dpn = m['ranks'] // m['nodes']
        priced = with_terms(prof, a)
        try:
            with cf.ThreadPoolExecutor(max_workers=2) as ex:
                prices = list(ex.map(lambda c: plan(a.parm, priced, c, dpn, world, chunks),
                                     sweep['configs']))
        finally:
            if priced != prof:
                os.unlink(priced)
        r = judge(sweep, prices)
        results[prof] = r
        s = r['speedup_auto_over_baseline']
        print('%s: selection %.1f%% plain, %.1f%% distinct; auto/fastest median %.3f worst %.3f; '
              'median |err| %.1f%%; auto/baseline min %.3f median %.3f max %.3f, >1.13x %.1f%%' % (
                  prof, 100 * r['selection_accuracy'], 100 * r['selection_accuracy_distinct'],
                  r['auto_over_fastest']['median'], r['auto_over_fastest']['worst'],
                  100 * r['median_abs_relative_error'], s['min'], s['median'], s['max'],
                  100 * s['share_above_1_13']))
        pol = r['policies']
        print('  policies: auto total / fastest %.3f; ' % pol['auto_over_fastest'] + ', '.join(
            'always %s %.3f%s [%d]' % (n, f['over_auto'], ' <- beats auto' if f['over_auto'] < 1.0
                                      else '', f['configs']) for n, f in pol['fixed'].items()))
        if 'auto_over_cross_fastest' in pol:
            print('  by halves of the rounds: auto / the fastest chosen by one half, timed by the '
                  'other %.3f; ' % pol['auto_over_cross_fastest'] + ', '.join(
                      'always %s %s' % nv for nv in pol['verdicts'].items()))
        print('  median |err| by schedule: ' + ', '.join(
            '%s %.1f%%' % (n, 100 * e) for n, e in r['error_by_schedule'].items()))
        if a.ratios:
            ratios(sweep, prices)
        if a.wrong:
            for w in r['wrong_choices']:
                print('  wrong #%(id)d T=%(T)d M=%(M)d H=%(H)d k=%(k)d esp=%(N_ESP)d ep=%(N_EP)d: '
                      'auto %(auto)s, fastest %(fastest)s (predicted %(predicted_auto_over_fastest).3f, '
                      'measured %(measured_auto_over_fastest).3f)' % w)
    if a.json:
        json.dump(results, open(a.json, 'w'), indent=1)


if __name__ == '__main__':
    main()
