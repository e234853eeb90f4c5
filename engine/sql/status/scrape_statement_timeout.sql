-- scrape_statement_timeout: a /metrics scrape's database gauges give up after 5 s, so a
-- stuck database cannot hold the scrape (Prometheus times out at 10 s by default) and it
-- still answers with the process metrics.
SET statement_timeout = '5s'
