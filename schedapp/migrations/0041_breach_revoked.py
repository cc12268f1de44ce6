"""``Breach.revoked``: the breach of an overrun schedapp revoked (``revoke_overrun``), whose
recovery never withdraws its alert. Before, the deadline pass recognised such a breach by a
marker in its detail ("; revoked (revoke_overrun)"); the existing rows carrying it are marked
here. The column is added with a constant database default (false: no rewrite, no scan of the
table; an older release's inserts get false) and no index or constraint; the marking updates
only the overrunning breaches that carry the marker, in batches, each its own short statement.
"""

from django.db import migrations, models

MARKER = "; revoked (revoke_overrun)"
BATCH = 1000


def mark(apps, schema_editor):
    Breach = apps.get_model("schedapp", "Breach")
    rows = Breach.objects.using(schema_editor.connection.alias).filter(
        kind="overrunning", revoked=False, detail__contains=MARKER
    )
    while True:
        ids = list(rows.order_by("id").values_list("id", flat=True)[:BATCH])
        if not ids:
            return
        Breach.objects.using(schema_editor.connection.alias).filter(id__in=ids).update(revoked=True)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0040_admit_run_v5")]

    operations = [
        migrations.AddField(
            model_name="breach",
            name="revoked",
            field=models.BooleanField(
                db_default=False,
                default=False,
                editable=False,
                help_text="schedapp revoked the overrunning run (revoke_overrun): its recovery "
                "never withdraws the alert.",
            ),
        ),
        migrations.RunPython(mark, migrations.RunPython.noop, elidable=False),
    ]
