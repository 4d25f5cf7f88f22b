#!/usr/bin/env python3
"""The largest stable lr x curvature of DGC's momentum updates, synchronous and one step late.

On one direction of a quadratic loss with curvature h the gradient is h w. Momentum SGD as dgc
runs it (docs/training.md, what one step does):
  heavy ball:  u = m u + g,        w -= lr u
  Nesterov:    u = m (u + g),      w -= lr (u + g)
where g is taken at the current weights (synchronous) or at the weights one step before
(`dgc train --pipeline 1`: each gradient is taken before the previous step's update lands).
For each momentum m this prints the largest a = lr h for which w stays bounded, found by
bisection on simulated iterates (no numpy needed), and the same in units of the effective
learning rate lr / (1 - m).

Usage: bench/staleness_bounds.py [--momenta 0.9,0.8,0.7,0.5,0]
"""
import argparse


def stable(a, m, nesterov, delay, steps=20000):
    w = [1.0] * (delay + 1)
    u = 0.0
    for _ in range(steps):
        g = a * w[-1 - delay]
        if nesterov:
            u = m * (u + g)
            step = u + g
        else:
            u = m * u + g
            step = u
        w.append(w[-1] - step)
        if abs(w[-1]) > 1e8:
            return False
        w = w[-(delay + 1):]
    return abs(w[-1]) < 1e3


def bound(m, nesterov, delay):
    low, high = 0.0, 8.0  # stable at low, unstable at high
    for _ in range(40):
        mid = 0.5 * (low + high)
        if stable(mid, m, nesterov, delay):
            low = mid
        else:
            high = mid
    return low


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--momenta", default="0.9,0.8,0.7,0.5,0",
                        help="comma-separated momenta (default: 0.9,0.8,0.7,0.5,0)")
    args = parser.parse_args()
    print("| momentum | update | synchronous: lr h < | one step late: lr h < | ratio |"
          " one step late, in lr/(1-m) units |")
    print("|---:|---|---:|---:|---:|---:|")
    for m in (float(x) for x in args.momenta.split(",")):
        for nesterov in (False, True):
            sync = bound(m, nesterov, 0)
            late = bound(m, nesterov, 1)
            print(f"| {m:g} | {'Nesterov' if nesterov else 'heavy ball'} | {sync:.3f} |"
                  f" {late:.3f} | {sync / late:.1f}x | {late / (1.0 - m) if m < 1 else 0:.2f} |")


if __name__ == "__main__":
    main()
