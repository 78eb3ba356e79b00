"""What the server tells about itself: the access log (`access`), Prometheus metrics
(`metrics`), OpenTelemetry tracing (`tracing`, `spans`), log set-up (`logs`), and the
recent traffic the page shows (`recent`)."""
