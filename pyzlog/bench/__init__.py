"""pyzlog's test rigs: the benchmark drivers behind `zlog bench` and
`python -m pyzlog.tools.spark_bench`, and the fault suite's report. They
use the client; the client never imports them."""
