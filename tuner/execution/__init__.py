"""Where tuning work runs: joining or starting the Ray cluster, the build and measurement tasks it runs (plain values in
and out), the TVM set-up they share, the cores each GPU's measurements take, NVRTC builds. The lowest layer: it imports
nothing else of the tuner's."""
