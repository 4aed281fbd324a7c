"""initial schema: jobs, runs, hosts, gpus, profiles, decisions, leases, models

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('decisions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('round_id', sa.Integer(), nullable=False),
    sa.Column('time', sa.Float(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=True),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('executed_at', sa.Float(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_decisions_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_decisions_round_id'), ['round_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_decisions_status'), ['status'], unique=False)

    op.create_table('hosts',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('address', sa.String(length=256), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('user', sa.String(length=128), nullable=False),
    sa.Column('key_path', sa.Text(), nullable=True),
    sa.Column('vc', sa.String(length=128), nullable=False),
    sa.Column('pool', sa.String(length=16), nullable=False),
    sa.Column('executor', sa.String(length=16), nullable=False),
    sa.Column('telemetry', sa.String(length=16), nullable=False),
    sa.Column('workdir', sa.Text(), nullable=False),
    sa.Column('python', sa.String(length=256), nullable=False),
    sa.Column('gpu_memory_mb', sa.Float(), nullable=False),
    sa.Column('draining', sa.Boolean(), nullable=False),
    sa.Column('reachable', sa.Boolean(), nullable=False),
    sa.Column('last_seen', sa.Float(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('added_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('jobs',
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=256), nullable=False),
    sa.Column('user', sa.String(length=128), nullable=False),
    sa.Column('vc', sa.String(length=128), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('command', sa.Text(), nullable=False),
    sa.Column('env', sa.JSON(), nullable=False),
    sa.Column('workload', sa.String(length=256), nullable=True),
    sa.Column('amp', sa.Boolean(), nullable=False),
    sa.Column('long_cold_start', sa.Boolean(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('submit_time', sa.Float(), nullable=False),
    sa.Column('start_time', sa.Float(), nullable=True),
    sa.Column('end_time', sa.Float(), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('end_reason', sa.Text(), nullable=True),
    sa.Column('ended_in_profiling', sa.Boolean(), nullable=False),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('profiled', sa.Boolean(), nullable=False),
    sa.Column('gpu_util', sa.Float(), nullable=True),
    sa.Column('mem_util', sa.Float(), nullable=True),
    sa.Column('gpu_mem_mb', sa.Float(), nullable=True),
    sa.Column('profile_emulated', sa.Boolean(), nullable=False),
    sa.Column('share_class', sa.Integer(), nullable=True),
    sa.Column('predicted_duration', sa.Float(), nullable=True),
    sa.Column('known_min_duration', sa.Float(), nullable=False),
    sa.Column('no_share', sa.Boolean(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('pending_reason', sa.Text(), nullable=True),
    sa.Column('queue_position', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('job_id'),
    sa.UniqueConstraint('seq')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_state'), ['state'], unique=False)

    op.create_table('leases',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('holder', sa.String(length=128), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('model_versions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('note', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('model_versions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_model_versions_kind'), ['kind'], unique=False)

    op.create_table('rounds',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('holder', sa.String(length=128), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('ended_at', sa.Float(), nullable=True),
    sa.Column('decide_ms', sa.Float(), nullable=True),
    sa.Column('decisions', sa.Integer(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('scheduler_state',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('gpus',
    sa.Column('host', sa.String(length=128), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('memory_mb', sa.Float(), nullable=False),
    sa.Column('uuid', sa.String(length=128), nullable=True),
    sa.Column('declared', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['host'], ['hosts.name'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('host', 'index')
    )
    op.create_table('job_events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('time', sa.Float(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.job_id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_events_job_id'), ['job_id'], unique=False)

    op.create_table('profile_samples',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.String(length=96), nullable=False),
    sa.Column('time', sa.Float(), nullable=False),
    sa.Column('gpu_index', sa.Integer(), nullable=False),
    sa.Column('gpu_util', sa.Float(), nullable=False),
    sa.Column('mem_util', sa.Float(), nullable=False),
    sa.Column('mem_used_mb', sa.Float(), nullable=False),
    sa.Column('job_mem_mb', sa.Float(), nullable=False),
    sa.Column('emulated', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.job_id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('profile_samples', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_profile_samples_job_id'), ['job_id'], unique=False)

    op.create_table('profiles',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.String(length=96), nullable=False),
    sa.Column('gpu_util', sa.Float(), nullable=False),
    sa.Column('mem_util', sa.Float(), nullable=False),
    sa.Column('gpu_mem_mb', sa.Float(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('window_s', sa.Float(), nullable=False),
    sa.Column('emulated', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.job_id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('profiles', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_profiles_job_id'), ['job_id'], unique=False)

    op.create_table('runs',
    sa.Column('run_id', sa.String(length=96), nullable=False),
    sa.Column('host', sa.String(length=128), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('pool', sa.String(length=16), nullable=False),
    sa.Column('gpu_indices', sa.JSON(), nullable=False),
    sa.Column('node_rank', sa.Integer(), nullable=False),
    sa.Column('partner', sa.String(length=64), nullable=True),
    sa.Column('profile_in_place', sa.Boolean(), nullable=False),
    sa.Column('profiling_until', sa.Float(), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('stop_reason', sa.String(length=32), nullable=True),
    sa.Column('decision_id', sa.Integer(), nullable=True),
    sa.Column('planned_at', sa.Float(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=True),
    sa.Column('ended_at', sa.Float(), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.job_id'], ),
    sa.PrimaryKeyConstraint('run_id', 'host')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index('ix_runs_active', ['state'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_job_id'), ['job_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_job_id'))
        batch_op.drop_index('ix_runs_active')

    op.drop_table('runs')
    with op.batch_alter_table('profiles', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_profiles_job_id'))

    op.drop_table('profiles')
    with op.batch_alter_table('profile_samples', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_profile_samples_job_id'))

    op.drop_table('profile_samples')
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_events_job_id'))

    op.drop_table('job_events')
    op.drop_table('gpus')
    op.drop_table('scheduler_state')
    op.drop_table('rounds')
    with op.batch_alter_table('model_versions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_model_versions_kind'))

    op.drop_table('model_versions')
    op.drop_table('leases')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_state'))

    op.drop_table('jobs')
    op.drop_table('hosts')
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_decisions_status'))
        batch_op.drop_index(batch_op.f('ix_decisions_round_id'))
        batch_op.drop_index(batch_op.f('ix_decisions_job_id'))

    op.drop_table('decisions')
