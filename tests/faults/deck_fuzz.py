#!/usr/bin/env python3
"""Deck fuzz: every key of the given decks (all of them, defaults included, as `ditrl check` prints the
effective deck) set to wrong and extreme values, one at a time through --set. Each case runs `ditrl check`;
when check accepts the deck, `ditrl train --max-rollouts 1` of it. A case fails when:
  - check exits with anything but 0 or 1, or rejects the value without naming the key;
  - train fails, times out or dies of a signal after check accepted the deck (check exists to find, before a
    job waits in a queue, what the run would refuse; the failures a run may still meet at start-up are
    listed in START_UP_REFUSALS).
Usage: deck_fuzz.py DITRL WORKDIR DECK... [--cases N] [--seed S] [--jobs J]
  --cases N: a seeded sample of N cases (0 = all; tests/CMakeLists.txt runs a sample, the full sweep is
  recorded in benchmarks/results/faults.md).
Exit status: 0 when no case failed, 1 otherwise (each failure printed)."""
import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tomllib

# Refusals a 1-rollout train may make after check accepted the deck: they depend on the machine the
# ranks run on, which check (run anywhere, e.g. on a login node) cannot know.
START_UP_REFUSALS = ("`ditrl plan`'s predicted peak",)


def wrong_values(value):
    if isinstance(value, bool):
        return ['2', '"yes"']
    if isinstance(value, int):
        return ['0', '-1', '65536', '1000000000000', '9223372036854775807', 'nan', '"x"', '1.5']
    if isinstance(value, float):
        return ['0.0', '-1.0', '1e300', 'nan', 'inf', '"x"']
    if isinstance(value, str):
        return ['""', '"bogus"', '1', '"../../../../nonexistent/zz"']
    if isinstance(value, list):
        return ['[]', '[1e12, -1]', '"x"', '[nan, nan]', '[0, 0]']
    return []


def flatten(table, prefix=''):
    for key, value in table.items():
        if isinstance(value, dict):
            yield from flatten(value, prefix + key + '.')
        elif not (isinstance(value, list) and value and isinstance(value[0], dict)):  # [[precision.override]]
            yield prefix + key, value


def effective_deck(ditrl, deck, env):
    out = subprocess.run([ditrl, 'check', deck, '--without-files'], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f'deck_fuzz: `ditrl check {deck}` fails:\n{out.stdout}{out.stderr}')
    return tomllib.loads('\n'.join(line for line in out.stdout.splitlines() if not line.startswith('#')))


def run_case(ditrl, workdir, env, index, deck, key, value):
    out_dir = os.path.join(workdir, f'case-{index}')
    sets = ['--set', f'{key}={value}', '--set', f'run.out_dir="{out_dir}"']
    case = {'deck': os.path.basename(deck), 'key': key, 'value': value}
    check = subprocess.run([ditrl, 'check', deck] + sets, capture_output=True, text=True, timeout=120, env=env)
    case['check_rc'] = check.returncode
    message = check.stdout + check.stderr
    if check.returncode not in (0, 1):
        case['failure'] = f'check exited {check.returncode}'
    elif check.returncode == 1 and key.split('.')[-1] not in message:
        case['failure'] = 'check refused it without naming the key'
    if check.returncode != 0:
        case['message'] = message[-400:]
        return case
    try:
        train = subprocess.run([ditrl, 'train', deck, '--max-rollouts', '1'] + sets, capture_output=True, text=True,
                               timeout=300, env=env)
        case['train_rc'] = train.returncode
        case['message'] = (train.stdout + train.stderr)[-600:]
        if train.returncode != 0 and not any(r in case['message'] for r in START_UP_REFUSALS):
            case['failure'] = f'check accepted it, train exited {train.returncode}'
    except subprocess.TimeoutExpired:
        case['train_rc'] = 'timeout'
        case['failure'] = 'check accepted it, train did not end within 300 s'
    shutil.rmtree(out_dir, ignore_errors=True)
    return case


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('ditrl')
    parser.add_argument('workdir')
    parser.add_argument('decks', nargs='+')
    parser.add_argument('--cases', type=int, default=0)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--jobs', type=int, default=2)
    args = parser.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1')
    os.makedirs(args.workdir, exist_ok=True)
    cases = [(deck, key, v) for deck in args.decks for key, value in flatten(effective_deck(args.ditrl, deck, env))
             if key != 'run.out_dir' for v in wrong_values(value)]
    if 0 < args.cases < len(cases):
        cases = random.Random(args.seed).sample(cases, args.cases)
    print(f'deck_fuzz: {len(cases)} cases over {len(args.decks)} deck(s)', flush=True)
    failures = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool, \
            open(os.path.join(args.workdir, 'cases.jsonl'), 'w') as log:
        for case in pool.map(lambda c: run_case(args.ditrl, args.workdir, env, c[0], *c[1]), enumerate(cases)):
            log.write(json.dumps(case) + '\n')
            if 'failure' in case:
                failures += 1
                print(f"FAIL {case['deck']} {case['key']} = {case['value']}: {case['failure']}\n  "
                      + case.get('message', '').replace('\n', '\n  '), flush=True)
    accepted = sum(1 for line in open(os.path.join(args.workdir, 'cases.jsonl')) if '"train_rc"' in line)
    print(f'deck_fuzz: {len(cases)} cases, {len(cases) - accepted} refused by check, {accepted} trained, '
          f'{failures} failed', flush=True)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
