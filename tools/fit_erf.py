#!/usr/bin/env python3
"""Fits the erf/erfc coefficients of codegen/mathlib.cpp (needs mpmath).

Prints, at 20 digits:
  small<d>  erf(x)/x = P(x^2) on |x| < 1, relative least squares, degree d,
            lowest degree first (mathlib lists them highest first for horner);
  cheb      the Chebyshev series of h(u) = (z + K) erfc(z) e^(z^2) in
            u = (z - K) / (z + K), K = 3, from an N-point DCT at 50 digits.
"""
import mpmath as mp

mp.mp.dps = 50
K = 3


def chebyshev(f, n=96):
    th = [mp.pi * (k + 0.5) / n for k in range(n)]
    fv = [f(mp.cos(t)) for t in th]
    return [(2 if j else 1) * mp.fsum(fv[k] * mp.cos(j * th[k]) for k in range(n)) / n
            for j in range(n)]


def h(u):
    if u == 1:
        return 1 / mp.sqrt(mp.pi)
    z = K * (1 + u) / (1 - u)
    return (z + K) * mp.erfc(z) * mp.exp(z * z)


def fit_small(deg, m=400):
    ts = [(1 - mp.cos(mp.pi * (i + 0.5) / m)) / 2 for i in range(m)]
    a = mp.matrix(m, deg + 1)
    rhs = mp.matrix(m, 1)
    for i, t in enumerate(ts):
        f = mp.erf(mp.sqrt(t)) / mp.sqrt(t)
        for j in range(deg + 1):
            a[i, j] = t ** j / f
        rhs[i] = 1
    sol = mp.lu_solve(a.T * a, a.T * rhs)
    return [sol[j] for j in range(deg + 1)]


if __name__ == "__main__":
    for deg in (6, 11):
        print(f"small{deg}:", ", ".join(mp.nstr(c, 20) for c in fit_small(deg)))
    print("cheb:", ", ".join(mp.nstr(c, 20) for c in chebyshev(h)[:27]))
