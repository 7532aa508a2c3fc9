"""Repository sync: publish, load and route model versions on Triton.

Repository sync: Triton repository layout, storage (filesystem/NFS, S3), signing, atomic publish,
Triton model control and traffic routing. Plain Python: never imports Airflow.
"""
