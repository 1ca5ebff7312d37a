"""The data pipeline on Spark: the traffic report and the replay of archived messages
(docs/pipeline.md).

`report` and `replay` are plain PySpark jobs (`spark-submit gateway/pipeline/report.py ...`
runs one on a cluster); `cli` is `gateway pipeline ...`, whose jobs start the SparkSession
themselves (`local[*]` unless `--master` names another). pyspark is the optional extra
`mq-gateway[pipeline]`; nothing here is imported by the gateway's server.
"""
