-- Migration 3: reactions. Activity events get their order from an allocator
-- of their own, separate from message global seqs: an activity is never a
-- message and never moves a scope's seqs.
CREATE SEQUENCE scope_activity_global_seq AS bigint;
