from django.urls import path

from examples.django_app import views

urlpatterns = [path("accounts/<int:account_id>/email", views.change_email)]
