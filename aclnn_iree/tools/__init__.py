"""The tools beside the library: the benchmark and its peers (bench.py, bench_peers.py,
bench_torch.py), the roofline (roofline.py) and the demos (demo.py, stereo.py, stereo_demo.py).
The library never imports them; the CLI does, on demand."""
