"""The tools beside the library: the benchmark and its peers (bench.py, bench_peers.py,
bench_torch.py), the roofline (roofline.py), the demos (demo.py, stereo.py, stereo_demo.py),
and install.py (how the package was installed, for messages).  The library never imports them;
the CLI does, on demand."""
