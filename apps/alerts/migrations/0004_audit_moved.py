from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("alerts", "0003_detector_pass"),
        # the acknowledgements are copied into the one audit log before their table goes
        ("audit", "0002_alert_acknowledgements"),
    ]

    operations = [
        migrations.AlterModelOptions(name="alert", options={}),
        migrations.DeleteModel(name="AuditEntry"),
    ]
