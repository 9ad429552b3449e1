-- The databases of a team's servers (the postgres image runs this once, on an empty volume).
CREATE DATABASE mlflow;
CREATE DATABASE mlflow_auth;
CREATE DATABASE prefect;
