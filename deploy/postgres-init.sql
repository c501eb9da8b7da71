-- compose only: the Prefect server's own database, and the login Grafana reads outbox with. The role
-- outbox_reader is made here first so the grant can be given; `outbox db upgrade` grants it SELECT.
CREATE DATABASE prefect OWNER outbox;
CREATE ROLE outbox_reader NOLOGIN;
CREATE ROLE grafana_reader LOGIN PASSWORD 'grafana_reader' IN ROLE outbox_reader;
ALTER ROLE grafana_reader SET statement_timeout = '5s';
