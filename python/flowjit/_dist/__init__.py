"""Where a job runs: devices, processes and placements (devices), logical
views and layout casts (views), and OneFlow's distribution settings that
flowjit accepts (collective_boxing, ssp)."""
