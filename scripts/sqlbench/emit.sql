-- pgbench: one change a transaction, to an object no watch matches.
select watchpump.emit('elsewhere/during-retention', 'push', '{}');
