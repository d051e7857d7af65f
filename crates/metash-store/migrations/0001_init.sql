-- metash on PostgreSQL, version 1: the hash-chained log and the task leases of `metash worker`.
-- One schema, `metash`, for every project on the server; each row names its project, so one
-- database serves a team's many projects and one worker can serve several.

-- The log: one row per record, the record's exact line kept (its hash is over those bytes).
CREATE TABLE metash.log (
    project text   NOT NULL,
    seq     bigint NOT NULL,
    kind    text   NOT NULL,
    line    text   NOT NULL,
    PRIMARY KEY (project, seq)
);

-- Events committed but not chained yet: a completion writes its events here in its own
-- transaction, without the head's lock, and the next chaining moves them into `log` in order.
-- So completions commit side by side (the server groups their fsyncs) and one chaining
-- transaction serves many of them.
CREATE TABLE metash.pending (
    id      bigserial PRIMARY KEY,
    project text      NOT NULL,
    kind    text      NOT NULL,
    agent   text,
    data    jsonb     NOT NULL
);
CREATE INDEX pending_project ON metash.pending (project, id);

-- Each project's last record: appends lock this row, which orders them and keeps `seq` gapless.
CREATE TABLE metash.heads (
    project text   PRIMARY KEY,
    seq     bigint NOT NULL,
    hash    text   NOT NULL
);

-- Fencing tokens: every lease gets the next value, so a newer lease always has a larger token.
CREATE SEQUENCE metash.fence;

CREATE TABLE metash.tasks (
    project        text        NOT NULL,
    id             text        NOT NULL,
    state          text        NOT NULL
                   CHECK (state IN ('waiting', 'ready', 'leased', 'done', 'failed')),
    -- dependencies not complete yet; the task is ready at 0
    remaining      integer     NOT NULL CHECK (remaining >= 0),
    labels         text[]      NOT NULL DEFAULT '{}',
    payload        jsonb       NOT NULL DEFAULT '{}',
    attempts       integer     NOT NULL DEFAULT 0,
    lease_token    bigint,
    lease_worker   text,
    lease_expires  timestamptz,
    result         jsonb,
    done_token     bigint,
    done_at        timestamptz,
    PRIMARY KEY (project, id),
    CHECK ((state = 'leased') = (lease_token IS NOT NULL))
);
CREATE INDEX tasks_ready ON metash.tasks (project, id) WHERE state = 'ready';
CREATE INDEX tasks_leased ON metash.tasks (lease_expires) WHERE state = 'leased';

-- Who waits for whom: completing `dep` counts down each `task` here.
CREATE TABLE metash.task_deps (
    project text NOT NULL,
    task    text NOT NULL,
    dep     text NOT NULL,
    PRIMARY KEY (project, dep, task)
);

CREATE TABLE metash.workers (
    id          text        PRIMARY KEY,
    labels      text[]      NOT NULL DEFAULT '{}',
    slots       integer     NOT NULL,
    host        text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now()
);
