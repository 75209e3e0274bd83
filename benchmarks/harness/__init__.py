"""What the tests and the benchmarks share, and the wheel does not ship: local gloo worlds (``worlds``), two
network-namespace hosts (``netns``) and head-to-head timing of candidates. The tests import it through pytest's
``pythonpath``, the benchmarks from their own folder."""
