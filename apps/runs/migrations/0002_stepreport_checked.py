# The checked step reports (checksums or canary) of a run, by step: a partial index, tiny
# beside the table. Built CONCURRENTLY: ingest keeps writing step reports meanwhile.
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("clusters", "0001_initial"), ("runs", "0001_initial")]

    operations = [
        AddIndexConcurrently(
            model_name="stepreport",
            index=models.Index(
                condition=models.Q(
                    ("grad_checksum__isnull", False),
                    ("param_checksum__isnull", False),
                    ("canary_norm__isnull", False),
                    _connector="OR",
                ),
                fields=["run", "step"],
                name="stepreport_run_checked",
            ),
        ),
    ]
