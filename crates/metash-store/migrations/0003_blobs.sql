-- metash on PostgreSQL, version 3: bytes that move between machines with a task (the git
-- bundle of its base, the bundle of a worker's commit), under a name per project.
CREATE TABLE metash.blobs (
    project    text        NOT NULL,
    name       text        NOT NULL,
    bytes      bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project, name)
);
