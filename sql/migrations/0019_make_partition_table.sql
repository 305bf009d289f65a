-- copy_kept_rows() became make_partition_table() (0300_operator.sql), which
-- add_partition() uses too, for a day and for its kept table.
drop function if exists watchpump.copy_kept_rows(text, text, text, bigint[], timestamptz, timestamptz);
