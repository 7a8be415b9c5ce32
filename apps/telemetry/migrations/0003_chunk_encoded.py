# Sealed chunks encoded (apps/core/codec.py): offsets and values as pcodec bytes, the arrays
# left empty. Layout and reasons in apps/telemetry/services.py.
from django.db import migrations

# STORAGE MAIN: the bytes are already compressed, so keep them in the row (no TOAST pointer,
# no TOAST index entry, no second fetch on read) unless a row could not fit on a page at all;
# pglz is only tried on rows over ~2 kB, and gives up after 1 kB of incompressible input.
ADD = """
ALTER TABLE telemetry_chunk ADD COLUMN ts_pco bytea, ADD COLUMN vals_pco bytea;
ALTER TABLE telemetry_chunk ALTER COLUMN ts_pco SET STORAGE MAIN,
                            ALTER COLUMN vals_pco SET STORAGE MAIN;
"""
DROP = "ALTER TABLE telemetry_chunk DROP COLUMN ts_pco, DROP COLUMN vals_pco"


def arrays_restore(apps, schema_editor) -> None:
    """Backwards: decode every encoded chunk into its arrays, before the columns go."""
    from apps.core.codec import floats_decode, ints_decode

    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT ctid::text, ts_pco, vals_pco FROM telemetry_chunk WHERE ts_pco IS NOT NULL"
        )
        for ctid, ts_pco, vals_pco in cursor.fetchall():
            cursor.execute(
                "UPDATE telemetry_chunk SET offsets_ms = %s, vals = %s,"
                " ts_pco = NULL, vals_pco = NULL WHERE ctid = %s::tid",
                [ints_decode(ts_pco).tolist(), floats_decode(vals_pco).tolist(), ctid],
            )


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0002_chunk_table")]

    operations = [
        migrations.RunSQL(ADD, DROP),
        migrations.RunPython(migrations.RunPython.noop, arrays_restore),
    ]
