"""What the engine tells its operators: metrics, the operator log, operational
events, `engine status`, duration percentiles and autovacuum advice."""
